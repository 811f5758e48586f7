"""Fault injection: make one rank raise, hang, die, or fail while writing its trace, to see what
the launcher and the bundle do about it (one line naming the rank, the other ranks' artifacts
kept). Set COMMPROBE_FAULT=KIND[:RANK] (no rank: every rank), KIND one of:

    raise   the rank raises during its repetitions      die    it exits at once (status 9)
    hang    it sleeps an hour (the --timeout names it)   trace  it raises while writing its trace

The tests use it; so can a user checking how their CI reports a dead rank. The analysis's map
workers read the same variable with their own kinds (`map-die`, `map-die-once`, `map-hang`,
NAME a substring of the trace's path: analyzers/ranks.py), which analyzers keep torch-free.
"""

from __future__ import annotations

import os
import time

KINDS = ("raise", "hang", "die", "trace")


def inject(rank: int, *kinds: str) -> None:
    """Act out COMMPROBE_FAULT here if it names one of `kinds` and this rank."""
    fault = os.environ.get("COMMPROBE_FAULT", "")
    if not fault:
        return
    kind, _, who = fault.partition(":")
    if kind not in kinds or (who and int(who) != rank):
        return
    if kind in ("raise", "trace"):
        raise RuntimeError(f"injected fault on rank {rank}")
    if kind == "hang":
        time.sleep(3600)
    if kind == "die":
        os._exit(9)
