"""Fault injection: make one rank raise, hang, die, or fail while writing its trace, to see what
the launcher and the bundle do about it (one line naming the rank, the other ranks' artifacts
kept). Set COMMPROBE_FAULT=KIND[:RANK] (no rank: every rank), KIND one of:

    raise   the rank raises during its repetitions      die    it exits at once (status 9)
    hang    it sleeps an hour (the --timeout names it)   trace  it raises while writing its trace
    mismatch  its first allreduce is an all_gather instead (the others allreduce): a collective mismatch
    size    its first allreduce has one element fewer than the others'

The tests use it; so can a user checking how their CI reports a dead rank. The analysis's map
workers read the same variable with their own kinds (`map-die`, `map-die-once`, `map-hang`,
NAME a substring of the trace's path: analyzers/ranks.py), which analyzers keep torch-free.
"""

from __future__ import annotations

import os
import time

KINDS = ("raise", "hang", "die", "trace", "mismatch", "size")
COMM_KINDS = ("mismatch", "size")  # acted out by FaultyComm, in the collective itself


def _fault(rank: int) -> str | None:
    """The kind COMMPROBE_FAULT names for this rank, if any."""
    fault = os.environ.get("COMMPROBE_FAULT", "")
    if not fault:
        return None
    kind, _, who = fault.partition(":")
    return None if who and int(who) != rank else kind


def inject(rank: int, *kinds: str) -> None:
    """Act out COMMPROBE_FAULT here if it names one of `kinds` and this rank."""
    kind = _fault(rank)
    if kind not in kinds:
        return
    if kind in ("raise", "trace"):
        raise RuntimeError(f"injected fault on rank {rank}")
    if kind == "hang":
        time.sleep(3600)
    if kind == "die":
        os._exit(9)


class FaultyComm:
    """A Comm whose first all_reduce on the faulty rank is wrong (COMMPROBE_FAULT=mismatch:R or
    size:R): what a rank with a diverging control flow or shape bug does to a real job. Everything
    else is the wrapped Comm's."""

    def __init__(self, inner, kind: str):
        self.inner, self.kind, self.armed = inner, kind, True

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def all_reduce(self, x):
        if not self.armed:
            return self.inner.all_reduce(x)
        self.armed = False
        if self.kind == "mismatch":
            self.inner.all_gather(x)
            return x
        flat = x.reshape(-1)
        self.inner.all_reduce(flat[:-1].clone())
        return x


def faulty(comms: dict, rank: int) -> dict:
    """`comms` (axis -> Comm) with the first axis's Comm wrapped when COMMPROBE_FAULT names a
    collective fault for this rank."""
    kind = _fault(rank)
    if kind not in COMM_KINDS or not comms:
        return comms
    first = next(iter(comms))
    return {a: FaultyComm(c, kind) if a == first else c for a, c in comms.items()}
