"""NCCL RAS status as `commprobe hang` findings (issue 59, item 3): the same shape, root first.

RAS sees communicators, not sequence numbers: per communicator, the ranks that gave no data and
how many collectives each rank launched. So the findings are: a process RAS considers dead, a
rank missing from a communicator (its process, host and GPU where RAS printed them), and a
collective-count MISMATCH (the ranks behind, with process and host). One snapshot cannot tell a
stuck communicator from ranks in flight (RAS's own guide says so: counts that rise between queries
are fine); two snapshots an interval apart can (`commprobe hang --ras 127.0.0.1:28028`): counts
frozen with ranks behind is a hang, counts rising with the same ranks behind a straggler.
"""

from __future__ import annotations

import time
from pathlib import Path

from .hang_records import SCHEMA
from .readers.nccl_ras import RasError, parse, query


def _who(r: dict) -> str:
    extra = f" (process {r['pid']} on node {r['host']}, GPU {r.get('gpu')})" if r.get("pid") else ""
    return f"rank {r['rank']}{extra}"


def _finding(kind: str, comm: dict | None, summary: str, missing=(), cause: str = "absent", **extra) -> dict:
    return {"kind": kind, "group": f"{comm['id']} ({comm['hash']})" if comm else "job", "axis": None,
            "ranks": [], "seq": None, "op": None, "concerned": [], "missing": list(missing), "stacks": {},
            "summary": summary, "role": "root", "cause": cause, "consequences": [], **extra}


def findings(status: dict, earlier: dict | None = None) -> dict:
    """The findings of one RAS status (and, with `earlier`, whether its counts moved since)."""
    out, notes = [], []
    before = {c["hash"]: c for c in (earlier or {}).get("comms", [])}
    for p in status["processes"]["dead"]:
        out.append(_finding("process_dead", None, f"process {p.get('pid')} on node {p.get('host')} (GPU "
                            f"{p.get('gpu')}) is considered dead by NCCL RAS (unreachable for 60 s)"))
    for p in status["processes"]["missing"]:
        out.append(_finding("process_unresponsive", None, f"process {p['pid']} on node {p['host']} (GPU {p['gpu']}) "
                            "gave RAS no communicator data (unresponsive: stopped, hung or dying)"))
    for c in status["comms"]:
        if c["missing"]:
            out.append(_finding("missing_rank", c, f"communicator {c['id']} ({c['hash']}): "
                                + ", ".join(_who(r) for r in c["missing"]) + " gave no data",
                                missing=[r["rank"] for r in c["missing"]]))
        groups = [g for g in c["counts"] if g.get("upto") is not None]
        if len({g["upto"] for g in groups}) > 1:
            top = max(g["upto"] for g in groups)
            behind = [g for g in groups if g["upto"] < top]
            ranks = [r for g in behind for r in g["ranks"]]
            n = sum(g["ranks_count"] for g in behind)
            old = before.get(c["hash"])
            moved = None if old is None else [(g["upto"], g["ranks_count"]) for g in old["counts"]] != [
                (g["upto"], g["ranks_count"]) for g in c["counts"]]
            state = ("frozen between the two queries: stuck" if moved is False else
                     "rising between the two queries: ranks in flight or a straggler" if moved else
                     "one snapshot: ask again; counts that rise are ranks in flight, counts that stay are stuck")
            who = ", ".join(_who(r) for r in ranks) if ranks else f"{n} rank(s) (RAS lists outliers only)"
            out.append(_finding("count_mismatch", c, f"communicator {c['id']} ({c['hash']}): {who} launched up to "
                                f"operation {min(g['upto'] for g in behind)}, others up to {top} "
                                f"({c.get('what') or 'collective operation counts'}); {state}",
                                missing=[r["rank"] for r in ranks], cause="host" if moved is False else "unknown",
                                moving=moved))
        if len(c["status"]) > 1 or any(g["ranks_count"] == 1 for g in c["status"]):
            out.append(_finding("status_mismatch", c, f"communicator {c['id']} ({c['hash']}): ranks in different "
                                "states (" + ", ".join(f"{g['ranks_count']} {g['status']}" for g in c["status"])
                                + "): initialization or tear-down in progress, fine if it clears on the next query",
                                cause="unknown"))
        if "ERROR" in c["errors"]:
            out.append(_finding("nccl_error", c, f"communicator {c['id']} ({c['hash']}) reports errors: "
                                + "; ".join(c["lines"][:4]), cause="unknown"))
    if status["timeouts"]:
        notes.append(f"RAS met {status['timeouts']} communication timeout(s) gathering the data: a process is slow "
                     "to answer or gone")
    if not out:
        notes.append("NCCL RAS reports every communicator complete and consistent")
    return {"schema": SCHEMA, "source": status["source"], "ranks": [], "groups": {}, "findings": out,
            "notes": notes}


def from_file(path: str | Path) -> dict:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise RasError(f"{path}: cannot read ({e.strerror})") from None
    return findings(parse(data, str(path)))


def ask(target: str, interval: float = 2.0, timeout: float = 10.0) -> dict:
    """Two RAS queries `interval` seconds apart: the findings of the second, moving or frozen."""
    first = parse(query(target, timeout), target)
    time.sleep(interval)
    return findings(parse(query(target, timeout), target), first)


__all__ = ["findings", "from_file", "ask"]
