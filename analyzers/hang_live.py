"""`commprobe hang --live TARGET`: which rank is stuck, now, asked of a running job (issue 59).

Each rank of a job can serve its Flight Recorder records and its Python stacks over a unix socket
(torch's `_WorkerServer`; readers/worker_server.py asks it). Every rank is asked at once, with a
deadline, a few times over a short interval:
- **hang**: no rank's counts move between the polls, and no rank's stack moves either (each group's last enqueued / completed
  sequence numbers, pg_status with the entries, hang_records.progress). The findings are
  `commprobe hang`'s own, from the same code (hang.diagnose over the records the ranks answered):
  the rank that never entered, a mismatch, a transfer none completes; each rank's stack says where.
- **straggler**: counts move, and one rank alone is behind its group's furthest in at least 3/4 of
  the polls (eight over two seconds): it is named with how far behind. A healthy job's ranks lag
  each other by a collective now and then, never the same one most of the time.
- **running**: counts move and no rank is behind in most polls: no finding.
- **busy**: no count moves, but some rank's own stack moved between the first poll and the last:
  work outside the recorded collectives (a measurement, another library's calls), not a hang yet.
- **quiet**: no count moves and no rank is inside a collective (all completed what they
  enqueued): the job is between collectives (compute, I/O, start-up), which is not a hang.
Ranks that do not answer are named, and the answer says it is partial. On gloo the records keep
state "scheduled" and no times: counts and stacks, not durations.
"""

from __future__ import annotations

import glob
import json
import math
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from commprobe.common.bundle import LIVE_SOCKETS
from commprobe.common.errors import InputError

from .hang import diagnose
from .hang_records import _index, faulthandler_stacks, progress, where
from .readers.flight_recorder import DumpError, RankDump, dump_of
from .readers.worker_server import EndpointError, is_tcp, post

SCHEMA = "commprobe.hang-live/1"
STRAGGLER_POLLS = 0.5  # the share of polls a rank must be behind in, alone, to be named
LEAD = 3  # ... and at least this many times as often as any other rank
MAX_TRACEBACK = 1 << 20
_TRAILING = re.compile(r"(\d+)(?:\.sock)?$")


def endpoints(target: str) -> dict[int, str]:
    """Each rank's endpoint: a commprobe run directory (its live.json), a directory of sockets
    (the rank is the number ending each name), a glob pattern, or a comma-separated list of
    sockets or 127.0.0.1:PORT (the rank is the number ending each name, else its position)."""
    p = Path(target)
    if p.is_dir() and (p / LIVE_SOCKETS).is_file():
        try:
            doc = json.loads((p / LIVE_SOCKETS).read_text())
            return {int(r): str(s) for r, s in doc["sockets"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise InputError(f"{p / LIVE_SOCKETS}: not the run's list of rank sockets") from None
    if p.is_dir():
        items = sorted(str(f) for f in p.iterdir() if f.is_socket())
        if not items:
            raise InputError(f"{target}: no sockets in the directory (a rank serves one with torch's _WorkerServer)")
    elif any(c in target for c in "*?["):
        items = sorted(f for f in glob.glob(target) if Path(f).is_socket())
        if not items:
            raise InputError(f"{target}: no socket matches")
    else:
        items = [t for t in target.split(",") if t]
        for t in items:
            if not is_tcp(t) and not Path(t).is_socket():
                raise InputError(f"{t}: neither a socket nor 127.0.0.1:PORT")
    ranks = [_TRAILING.search(Path(t).name) if not is_tcp(t) else None for t in items]
    if all(ranks) and len({int(m.group(1)) for m in ranks}) == len(items):
        return {int(m.group(1)): t for m, t in zip(ranks, items)}
    return dict(enumerate(items))


def traceback_stacks(text: str) -> list[dict]:
    """What `dump_traceback` answers (faulthandler's text, hang_records.faulthandler_stacks) as
    [{thread, main, frames}]; the main thread is the one whose outermost frame is `<module>`."""
    out = faulthandler_stacks(text)
    main = next((s for s in out if s["frames"] and s["frames"][0]["name"] == "<module>"),
                next((s for s in out if s["frames"] and not s["current"]), None))
    if main is not None:
        main["main"] = True
    return [{"thread": s["thread"], "main": s is main, "frames": s["frames"]} for s in out]


def _ask(rank: int, target: str, deadline: float) -> tuple[int, RankDump | None, str | None]:
    try:
        body = post(target, "fr_trace_json", deadline)
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            raise EndpointError(f"{target}: fr_trace_json answered {len(body)} bytes that are not JSON") from None
        if isinstance(doc, dict) and "entries" not in doc and ("version" in doc or "pg_config" in doc):
            doc = {**doc, "entries": []}  # a rank that has recorded nothing yet answers without the list
        d = dump_of(doc, rank, f"rank {rank} ({target})")
        tb = post(target, "dump_traceback", deadline)[:MAX_TRACEBACK].decode("utf-8", "replace")
        d.stacks = traceback_stacks(tb)
        return rank, d, None
    except (EndpointError, DumpError) as e:
        return rank, None, str(e)


def snapshot(eps: dict[int, str], timeout: float) -> tuple[dict[int, RankDump], dict[int, str]]:
    """Every rank asked at once, all within `timeout` seconds: (answers, {rank: why none})."""
    deadline = time.monotonic() + timeout
    with ThreadPoolExecutor(max_workers=min(64, max(1, len(eps)))) as pool:
        got = list(pool.map(lambda kv: _ask(kv[0], kv[1], deadline), eps.items()))
    return {r: d for r, d, _ in got if d is not None}, {r: e for r, _, e in got if e is not None}


def _counts(d: RankDump) -> dict[str, tuple[int | None, int | None]]:
    idx = _index(d)
    return {pg: progress(d, pg) for pg in sorted(idx["pgs"] | set(idx["status"]))}


def live(target: str, polls: int = 8, interval: float = 2.0, timeout: float = 5.0) -> dict:
    """The live answer: state (hang, straggler, running, unknown), findings, per-rank progress and
    stacks, who did not answer."""
    eps = endpoints(target)
    history: list[dict[int, dict]] = []
    stacks: list[dict[int, list]] = []  # each poll's main-thread frames per rank
    dumps: dict[int, RankDump] = {}
    missing: dict[int, str] = {}
    for i in range(max(2, polls)):
        if i:
            time.sleep(interval / (max(2, polls) - 1))
        dumps, missing = snapshot(eps, timeout)
        history.append({r: _counts(d) for r, d in dumps.items()})
        stacks.append({r: next((st["frames"] for st in d.stacks if st.get("main")), []) for r, d in dumps.items()})
    moved = sorted(r for r in stacks[-1] if r in stacks[0] and stacks[0][r] != stacks[-1][r])
    answered = sorted(dumps)
    out = {"schema": SCHEMA, "target": target, "ranks": answered, "unanswered": {str(r): w for r, w in sorted(missing.items())},
           "partial": bool(missing), "polls": len(history), "interval_s": interval,
           "progress": {str(r): {pg: list(c) for pg, c in history[-1].get(r, {}).items()} for r in answered},
           "stacks": {str(r): _where(dumps[r]) for r in answered}, "findings": [], "notes": []}
    if not dumps:
        out["state"] = "unknown"
        out["notes"].append("no rank answered: " + "; ".join(f"rank {r}: {w}" for r, w in sorted(missing.items())))
        return out
    moving = _moving(history)
    if not any(d.entries or d.pg_status for d in dumps.values()):
        out["state"] = "unknown"
        out["notes"].append("no collective recorded yet (Flight Recorder on? TORCH_FR_BUFFER_SIZE)")
    elif not moving and not any(c[0] is not None and c[1] is not None and c[0] > c[1]
                                for counts in history[-1].values() for c in counts.values()):
        out["state"] = "quiet"
        out["notes"].append("no count moved and no rank is inside a collective: the job is between collectives "
                            "(compute, I/O, start-up or its end), not waiting in one")
    elif not moving and moved:
        # counts still, but a rank's own stack moved between the first poll and the last: it is
        # working outside the recorded collectives (its own code, another library's calls), not
        # stuck; a hang holds every stack where it is
        out["state"] = "busy"
        out["notes"].append(f"no count moved, but rank(s) {moved} moved in their own code between the polls "
                            f"(now at {', '.join(str(out['stacks'].get(str(r))) for r in moved)}): work outside "
                            "the recorded collectives, not a hang yet; ask again")
    elif not moving:
        out["state"] = "hang"
        diag = diagnose(list(dumps.values()), source=target)
        out["findings"], out["groups"] = diag["findings"], diag["groups"]
        out["notes"] += diag["notes"]
    else:
        out["state"], out["straggler"] = _straggler(history)
        if out["state"] == "straggler":
            s = out["straggler"]
            out["findings"].append({"kind": "straggler", "ranks": [s["rank"]], "pg": s["pg"], "summary": (
                f"rank {s['rank']} is behind its group in {s['polls_behind']} of {s['polls']} polls, by up to "
                f"{s['behind']} collective(s), while counts move: a slow rank, not a hang"
                + (f"; it is at {out['stacks'][str(s['rank'])]}" if out["stacks"].get(str(s["rank"])) else ""))})
    if missing:
        out["notes"].append(f"a partial answer: rank(s) {sorted(missing)} did not answer")
    return out


def _where(d: RankDump) -> str | None:
    main = next((s for s in d.stacks if s.get("main")), None)
    f = where(main["frames"], innermost_first=False) if main and main["frames"] else None
    return f"{f['file']}:{f['line']} in {f['name']}" if f else None


def _moving(history: list[dict[int, dict]]) -> bool:
    """Did any rank's count in any group change between the first poll and the last?"""
    first, last = history[0], history[-1]
    return any(first.get(r, {}).get(pg) != c for r, groups in last.items() for pg, c in groups.items()
               if r in first)


def _straggler(history: list[dict[int, dict]]) -> tuple[str, dict | None]:
    """A rank alone behind its group's furthest enqueued count in STRAGGLER_POLLS of the polls or
    more; the group it lags in most."""
    behind: dict[tuple[int, str], list[int]] = {}
    for poll in history:
        pgs = {pg for groups in poll.values() for pg in groups}
        for pg in pgs:
            enq = {r: poll[r][pg][0] for r in poll if pg in poll[r] and poll[r][pg][0] is not None}
            if len(enq) < 2:
                continue
            top = max(enq.values())
            lagging = [r for r, n in enq.items() if n < top]
            if len(lagging) == 1:  # one rank behind the rest: a straggler's mark; several: in-flight spread
                behind.setdefault((lagging[0], pg), []).append(top - enq[lagging[0]])
    n = len(history)
    need = max(2, math.ceil(STRAGGLER_POLLS * n))
    counts = {f"{r}|{pg}": len(v) for (r, pg), v in sorted(behind.items())}
    found = sorted(((len(v), max(v), r, pg) for (r, pg), v in behind.items()), reverse=True)
    if not found or found[0][0] < need or (len(found) > 1 and found[1][0] * LEAD > found[0][0]):
        return "running", {"named": None, "polls_behind_alone": counts, "polls": n} if counts else None
    k, most, r, pg = found[0]
    return "straggler", {"rank": r, "pg": pg, "polls_behind": k, "polls": n, "behind": most,
                         "polls_behind_alone": counts}


__all__ = ["live", "endpoints", "snapshot", "traceback_stacks", "SCHEMA"]
