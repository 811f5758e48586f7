"""One rank's Flight Recorder records, read for the hang diagnosis: where a rank waits (its live
stack, else the frames of a record), how far it got in each group (entries and pg_status
together, a trimmed ring read as trimmed), and what a dead rank's log says.

Groups come from the run's own record of which process group is which axis (our bundles), else
the dumps' pg_config, else the ranks that recorded the group.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .readers.flight_recorder import RankDump, _as_int

SCHEMA = "commprobe.hang/2"  # every hang answer's: dumps (hang.py), NCCL RAS (hang_ras.py)

# Frames that are the plumbing of a collective, not where the program called it
_PLUMBING_FILES = re.compile(r"(/|^)(torch|collectives|threading\.py|contextlib\.py)(/|$)|c10d_logger|/threading\.py$")
_COMM_METHODS = frozenset({"all_reduce", "all_gather", "all_to_all", "send_recv", "send_recv_start", "barrier", "_timed",
                           "wait", "__getattr__"})
_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):$")
_FH_FRAME = re.compile(r'^  File "(.+)", line (\d+) in (.+)$')


def _is_plumbing(frame: dict) -> bool:
    f = str(frame.get("file") or frame.get("filename") or "")
    if _PLUMBING_FILES.search(f):
        return True
    return bool(re.search(r"(/|^)probe/(run|faults)\.py$", f)) and frame.get("name") in _COMM_METHODS


def where(frames: list[dict], innermost_first: bool) -> dict | None:
    """The frame where the program waits: the innermost one that is not collective plumbing."""
    order = frames if innermost_first else list(reversed(frames))
    for f in order:
        if not _is_plumbing(f):
            return {"file": str(f.get("file") or f.get("filename")), "line": int(f.get("line") or f.get("lineno") or 0),
                    "name": str(f.get("name", ""))}
    return None


def short(frame: dict | None) -> str:
    if not frame:
        return "?"
    parts = Path(frame["file"]).parts
    return f"{'/'.join(parts[-2:])}:{frame['line']}"


def _main_stack(d: RankDump) -> dict | None:
    main = next((s for s in d.stacks if s.get("main")), None)
    return where(main["frames"], innermost_first=False) if main else None


def _index(d: RankDump) -> dict:
    """Per dump, built once: collective entries by group and sequence number, the groups its
    entries name, its pg_config by group name and its pg_status by group name. Every group's
    diagnosis reads them, so a dump of 20,000 groups is diagnosed in one pass over its entries,
    not one per group."""
    idx = getattr(d, "_index", None)
    if idx is None:
        seqs: dict[str, dict[int, dict]] = {}
        names: dict[str, str] = {}  # pg_id (as pg_status keys it) -> pg name
        for e in d.entries:
            names.setdefault(str(e["pg_id"]), e["pg_name"])
            if not e.get("is_p2p") and e["collective_seq_id"] >= 0:
                seqs.setdefault(e["pg_name"], {})[e["collective_seq_id"]] = e
        cfg = {}
        for c in d.pg_config.values():
            if isinstance(c, dict):
                cfg.setdefault(str(c.get("name")), c)
        idx = {"seqs": seqs, "pgs": {e["pg_name"] for e in d.entries}, "cfg": cfg,
               "status": _status_by_name(d.pg_status, names, cfg),
               # the ring's oldest record: what a record it no longer holds is older than
               "oldest": min((e["time_created_ns"] or (1 << 62) for e in d.entries), default=None)}
        d._index = idx
    return idx


def _status_by_name(pg_status: dict, names: dict[str, str], cfg: dict) -> dict[str, dict[str, int]]:
    """pg_status as {pg name: {enqueued, started, completed}} (ints; -1 or absent: not known).
    torch keys pg_status by the group's id, the entries' pg_id, and pg_config by its name: an id
    is named through the entries that carry both. An id no entry names (the ring trimmed every one
    of that group's records away) is taken as the name only where every id the entries name is its
    own name, as torch's default names are."""
    identity = all(k == v for k, v in names.items())
    out = {}
    for k, v in list(pg_status.items())[:1 << 17]:
        if not isinstance(v, dict):
            continue
        name = names.get(str(k)) or (str(k) if identity and str(k) in cfg else None)
        if name is None:
            continue
        st = {}
        for key, field in (("last_enqueued_collective", "enqueued"), ("last_started_collective", "started"),
                           ("last_completed_collective", "completed")):
            n = _as_int(v.get(key), -2, -1, 1 << 62)
            if n >= 0 or (n == -1 and field != "started"):  # -1: none yet (sequence numbers start at 1)
                st[field] = max(n, 0)
        if st:
            out[name] = st
    return out


def _ranks(v) -> list[int]:
    try:
        v = json.loads(v) if isinstance(v, str) else v
    except (ValueError, RecursionError):
        return []
    return sorted(int(r) for r in v if isinstance(r, int) and not isinstance(r, bool)) if isinstance(v, list) else []


def _members(pg: str, dumps: list[RankDump]) -> tuple[list[int], str | None]:
    for d in dumps:
        g = d.groups.get(pg)
        if g:
            return _ranks(g["ranks"]), g.get("axis")
    for d in dumps:
        cfg = _index(d)["cfg"].get(pg)
        if cfg is not None:
            ranks = _ranks(cfg.get("ranks"))
            if ranks:
                return ranks, None
    return sorted(d.rank for d in dumps if pg in _index(d)["pgs"]), None


def _completed(e: dict) -> bool:
    return bool(e.get("retired")) or e.get("state") == "completed"


def _by_seq(d: RankDump, pg: str) -> dict[int, dict]:
    return _index(d)["seqs"].get(pg, {})


def _stack_of(d: RankDump, entry: dict | None) -> dict | None:
    """Where a rank waits: its live stack when it was dumped, else the frames recorded with the entry."""
    live = _main_stack(d)
    if live:
        return live
    if entry and entry.get("frames"):
        return where(entry["frames"], innermost_first=True)
    return None


def progress(d: RankDump, pg: str) -> tuple[int | None, int | None]:
    """How far a rank got in a group: (last sequence number it enqueued, last it completed), from its
    entries and its pg_status together; None where neither tells (a ring trimmed of every record of
    the group, no status). A group completes in order, so an entry at or below the status's last
    completed is completed whatever its own state says; an entry held is enqueued even where the
    status lags it (torch bumps last_enqueued only once the library call returns). Where only
    entries tell and the oldest held is not completed, what came before it is not known: the
    completed count is then the bound below that entry."""
    held = _by_seq(d, pg)
    status = _index(d)["status"]
    st = status.get(pg, {})
    if not held and not st:
        # torch keeps a status for every group a rank ever enqueued on, and a ring that holds its
        # first record (record_id 0), or none at all, lost nothing: either says "never enqueued"
        whole = not d.entries or min(e["record_id"] for e in d.entries) == 0
        return (0, 0) if status or whole else (None, None)
    enq = max([*held, st.get("enqueued", -1)])
    done = [q for q, e in held.items() if _completed(e)]
    comp = st.get("completed", -1)
    if done:
        comp = max(comp, max(done))
    elif held and "completed" not in st:
        comp = min(held) - 1
    enq = max(enq, comp)
    return enq, comp


def _last(d: RankDump) -> dict | None:
    """A rank's newest record: where it last called a collective (a dump without live stacks)."""
    return max(d.entries, key=lambda e: e["record_id"], default=None)


_FATAL = ("Fatal Python error", "terminate called", "Traceback (most recent call last)")


def _died_evidently(d: RankDump | None, log: str) -> bool:
    """A rank without records died only if it says so: the exception it dumped on its way out, or
    a fatal error in its log. A rank that merely did not dump is absent, not dead."""
    return bool(d is not None and d.error) or any(s in log for s in _FATAL)


def _last_words(log: str | None) -> str:
    """The line of a dead rank's log that says why: a C++ `what():`, else the last error line."""
    lines = [ln.strip() for ln in (log or "").splitlines() if ln.strip()]
    for pick in (lambda ln: ln.startswith("what():"), lambda ln: "Error" in ln or "error" in ln):
        found = [ln for ln in lines if pick(ln)]
        if found:
            return found[-1][:240]
    return lines[-1][:240] if lines else ""


def faulthandler_stacks(text: str) -> list[dict]:
    """Python faulthandler's text (a killed rank's log; a live rank's `dump_traceback` answer) as
    [{thread, current, frames}], frames outermost first as the dumps' stacks are kept. A block ends
    at the first line that is neither a frame nor blank."""
    out, cur = [], None
    for ln in text.splitlines()[:20000]:
        if m := _FH_THREAD.match(ln):
            cur = {"thread": m.group(2), "current": m.group(1) == "Current thread", "frames": []}
            out.append(cur)
        elif cur is not None and (f := _FH_FRAME.match(ln)):
            cur["frames"].append({"file": f.group(1)[:1000], "line": int(f.group(2)[:9]), "name": f.group(3)[:200]})
        elif cur is not None and ln.strip():
            cur = None
    for st in out:
        st["frames"].reverse()  # faulthandler writes the most recent call first
    return out


def _faulthandler_stack(log: str) -> dict | None:
    """Where a rank killed by a signal was: Python's faulthandler wrote every thread's frames to its
    log; the thread that is not our dump watcher."""
    for st in faulthandler_stacks(log):
        frames = st["frames"]
        if frames and not any(f["file"].endswith("forensics.py") for f in frames):
            return where(frames, innermost_first=False)
    return None
