"""Hang forensics: which rank, which group, which collective, where — from the Flight Recorder
records of every rank (readers/flight_recorder.py), one diagnosis per process group.

Per group, collectives are matched across its ranks by their sequence number (the group's own
counter, `collective_seq_id`; a host op's `Seq` in a Kineto trace is the same counter). The first
sequence number where the ranks disagree or stop is the finding:
- `type_mismatch`, `size_mismatch`, `dtype_mismatch`: the ranks called different collectives, or
  the same one with other sizes or element types, at one sequence number (the first such);
- `missing_rank`: some ranks entered a collective that others never enqueued: the missing ranks
  are where the run stopped (their stacks say where they are);
- `stuck_in_transfer`: every rank entered and none completed: a peer or link fault, not the program;
- `rank_died`: a rank left no records (it died); its own last error line where its log has one
  (gloo's "Received data size doesn't match expected size" makes it a `size_mismatch`).
Each finding names the axis and the group's ranks, the op, the sequence number, the ranks
concerned and each rank's stack line (file:line) where it waits; with NCCL's timings, who started
last and how long the others waited. Groups come from the run's own record of which process group
is which axis (our bundles), else the dumps' pg_config, else the ranks that recorded the group.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from commprobe.common.bundle import FLIGHT_RECORDER, MANIFEST

from .readers.flight_recorder import DumpError, RankDump, load_dir, load_dump

SCHEMA = "commprobe.hang/1"
# Frames that are the plumbing of a collective, not where the program called it
_PLUMBING_FILES = re.compile(r"(/|^)(torch|collectives|threading\.py|contextlib\.py)(/|$)|c10d_logger|/threading\.py$")
_COMM_METHODS = frozenset({"all_reduce", "all_gather", "all_to_all", "send_recv", "send_recv_start", "barrier", "_timed",
                           "wait", "__getattr__"})
_GLOO_SIZE = re.compile(r"(\d+) vs (\d+)\. Received data size doesn't match expected size")
_FH_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$")
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
    entries name, and its pg_config by group name. Every group's diagnosis reads them, so a dump
    of 20,000 groups is diagnosed in one pass over its entries, not one per group."""
    idx = getattr(d, "_index", None)
    if idx is None:
        seqs: dict[str, dict[int, dict]] = {}
        for e in d.entries:
            if not e.get("is_p2p") and e["collective_seq_id"] >= 0:
                seqs.setdefault(e["pg_name"], {})[e["collective_seq_id"]] = e
        cfg = {}
        for c in d.pg_config.values():
            if isinstance(c, dict):
                cfg.setdefault(str(c.get("name")), c)
        idx = {"seqs": seqs, "pgs": {e["pg_name"] for e in d.entries}, "cfg": cfg}
        d._index = idx
    return idx


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


def _finding(kind, pg, axis, members, seq, op, concerned, missing, stacks, summary, **extra) -> dict:
    return {"kind": kind, "group": pg, "axis": axis, "ranks": members, "seq": seq, "op": op, "concerned": concerned,
            "missing": missing, "stacks": {str(r): s for r, s in sorted(stacks.items())}, "summary": summary, **extra}


def _label(axis: str | None, op: str) -> str:
    return f"{axis.upper()} {op}" if axis and axis != "world" else op


def _group_findings(pg: str, dumps: list[RankDump], logs: dict[int, str]) -> list[dict]:
    members, axis = _members(pg, dumps)
    by_rank = {d.rank: d for d in dumps}
    have = [r for r in members if r in by_rank and by_rank[r].records]
    seqs = {r: _by_seq(by_rank[r], pg) for r in have}
    group = f"group {members}"
    # 1. different calls at one sequence number (the first one where they differ)
    common = sorted(set.intersection(*(set(s) for s in seqs.values()))) if len(seqs) > 1 else []
    for s in common:
        es = {r: seqs[r][s] for r in have}
        for key, kind in (("op", "type_mismatch"), ("input_sizes", "size_mismatch"), ("input_dtypes", "dtype_mismatch")):
            vals = {r: e.get(key) for r, e in es.items()}
            if len({json.dumps(v) for v in vals.values()}) > 1:
                stacks = {r: _stack_of(by_rank[r], es[r]) for r in have}
                what = ", ".join(f"rank {r}: {v}" for r, v in vals.items())
                return [_finding(kind, pg, axis, members, s, es[have[0]]["op"], sorted(vals), [], stacks,
                                 f"{_label(axis, es[have[0]]['op'])} seq {s} ({group}): ranks disagree on "
                                 f"{'the op' if key == 'op' else key.replace('input_', 'input ')}: {what}",
                                 values={str(r): v for r, v in vals.items()})]
    # 2. the first collective some rank entered and did not complete
    stuck = [min((q for q, e in sq.items() if not _completed(e)), default=None) for sq in seqs.values()]
    stuck = [q for q in stuck if q is not None]
    dead = [r for r in members if r not in have and _died_evidently(by_rank.get(r), logs.get(r, ""))]
    absent = [r for r in members if r not in have and r not in dead]
    if dead:  # a rank died: where the others were then, and what its own log says
        s = min(stuck) if stuck else max((max(sq) for sq in seqs.values() if sq), default=None)
        op = next((sq[s]["op"] for sq in seqs.values() if s in sq), None)
        stacks = {r: _stack_of(by_rank[r], seqs[r].get(s)) for r in have}
        out = []
        for r in dead:
            stacks[r] = _main_stack(by_rank[r]) if r in by_rank else None
            stacks[r] = stacks[r] or _faulthandler_stack(logs.get(r, ""))
            size = _GLOO_SIZE.search(logs.get(r, ""))
            waits = "; ".join(f"rank {e} was in it at {short(stacks.get(e))}" for e in have if s in seqs[e])
            if size and s is not None:
                out.append(_finding("size_mismatch", pg, axis, members, s, op, sorted([*have, r]), [], stacks,
                                    f"{_label(axis, op)} seq {s} ({group}): rank {r} called it with another size and "
                                    f"died at {short(stacks[r])} (its log, gloo: {size.group(1)} vs {size.group(2)} "
                                    f"bytes, received vs expected){'; ' + waits if waits else ''}",
                                    evidence=size.group(0)))
            else:
                out.append(_died(pg, axis, members, r, stacks[r], logs.get(r) or (by_rank[r].error if r in by_rank else ""),
                                 s, op, waits))
        return out
    if not stuck:
        return []
    s = min(stuck)
    entered = [r for r in have if s in seqs[r]]
    missing = [r for r in have if s not in seqs[r] and max(seqs[r], default=-1) < s]
    op = seqs[entered[0]][s]["op"] if entered else "?"
    stacks = {r: _stack_of(by_rank[r], seqs[r].get(s)) for r in have}
    if absent and not missing:
        waits = ", ".join(f"rank {r} waits in it at {short(stacks.get(r))}" for r in entered)
        return [_finding("no_records", pg, axis, members, s, op, entered, absent, stacks,
                         f"{_label(axis, op)} seq {s} ({group}) did not complete: {waits}; rank(s) "
                         f"{', '.join(map(str, absent))} left no Flight Recorder records, so whether they entered it "
                         f"cannot be told")]
    if missing:
        waits = ", ".join(f"rank {r} waits in it at {short(stacks.get(r))}" for r in entered)
        at = ", ".join(f"rank {r} is at {short(stacks.get(r))}" for r in missing)
        who = "rank" if len(missing) == 1 else "ranks"
        return [_finding("missing_rank", pg, axis, members, s, op, entered, missing, stacks,
                         f"{who} {', '.join(map(str, missing))} never entered {_label(axis, op)} seq {s} ({group}); "
                         f"{waits}; {at}")]
    extra = {}
    started = {r: seqs[r][s].get("time_discovered_started_ns") for r in entered}
    if all(isinstance(v, int) and v > 0 for v in started.values()) and len(started) > 1:
        last = max(started, key=started.get)
        extra = {"started_last": last, "waited_s": {str(r): (started[last] - t) / 1e9 for r, t in started.items()}}
    return [_finding("stuck_in_transfer", pg, axis, members, s, op, entered, [], stacks,
                     f"every rank of {group} entered {_label(axis, op)} seq {s} and none completed: a peer or link "
                     f"fault, not the program" + (f"; rank {extra['started_last']} started last" if extra else ""),
                     **extra)]


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


def _faulthandler_stack(log: str) -> dict | None:
    """Where a rank killed by a signal was: Python's faulthandler wrote every thread's frames to its
    log (most recent call first); the thread that is not our dump watcher."""
    blocks, cur = [], None
    for ln in log.splitlines():
        if _FH_THREAD.match(ln):
            cur = []
            blocks.append(cur)
        elif cur is not None and (m := _FH_FRAME.match(ln)):
            cur.append({"file": m.group(1), "line": int(m.group(2)), "name": m.group(3)})
        elif cur is not None and ln.strip():
            cur = None
    for frames in blocks:
        if frames and not any(f["file"].endswith("forensics.py") for f in frames):
            return where(frames, innermost_first=True)
    return None


def _died(pg, axis, members, r, stack: dict | None, log: str | None, seq=None, op=None, waits: str = "") -> dict:
    words = _last_words(log)
    when = f" while its group {members} was at {_label(axis, op)} seq {seq}" if op else ""
    return _finding("rank_died", pg, axis, members, seq, op, [r], [r], {r: stack},
                    f"rank {r} died at {short(stack)}{when}, leaving no Flight Recorder records"
                    + (f"; its last words: {words}" if words else "") + (f"; {waits}" if waits else ""))


def diagnose(dumps: list[RankDump], logs: dict[int, str] | None = None, source: str = "") -> dict:
    """The findings over all ranks' records, per process group (JSON schema commprobe.hang/1)."""
    logs = logs or {}
    if not dumps:
        raise DumpError(f"{source}: no Flight Recorder dumps")
    _check_one_job(dumps, source)
    pgs = sorted({e["pg_name"] for d in dumps for e in d.entries}, key=lambda p: (len(p), p))
    findings, groups = [], {}
    for pg in pgs:
        members, axis = _members(pg, dumps)
        groups[pg] = {"axis": axis, "ranks": members}
        findings += _group_findings(pg, dumps, logs)
    if not pgs:  # no records at all: only the stacks of ranks that raised
        for d in dumps:
            if _died_evidently(d, logs.get(d.rank, "")):
                findings.append(_died("?", None, [], d.rank, _main_stack(d), logs.get(d.rank) or d.error))
    notes = []
    ranks = [d.rank for d in dumps if d.records]
    expected = sorted({r for g in groups.values() for r in g["ranks"]})
    absent = [r for r in expected if r not in ranks]
    if absent:
        notes.append(f"no records from rank(s) {absent}: a partial answer from ranks {ranks}")
    return {"schema": SCHEMA, "source": source, "ranks": ranks, "groups": groups, "findings": findings, "notes": notes}


def _check_one_job(dumps: list[RankDump], source: str) -> None:
    """Dumps of two jobs mixed in one directory give nonsense matches: refuse them in one line."""
    spans = []
    for d in dumps:
        t = [e.get("time_created_ns") for e in d.entries if isinstance(e.get("time_created_ns"), int)]
        if t:
            spans.append((min(t), max(t), d.rank))
    spans.sort()
    for (a0, a1, ra), (b0, b1, rb) in zip(spans, spans[1:]):
        if b0 - max(a1, a0) > 3600e9:
            raise DumpError(f"{source}: rank {ra}'s and rank {rb}'s records are {(b0 - a1) / 3600e9:.0f} h apart: dumps "
                            f"of two jobs mixed? Analyze one job's dumps at a time")


def last_collectives(directory: Path, findings: list[dict], keep: int = 3) -> None:
    """Join with the Kineto traces beside the records, where there are any: each finding gains,
    per rank, the last host collective ops up to its sequence number (`before`). A host op's `Seq`
    (record_param_comms, as PyTorch writes it for NCCL) is the group's own counter, the
    Flight Recorder's collective_seq_id. gloo's CPU traces (torch 2.13) write no record_param_comms,
    so there is nothing to join there."""
    from .readers.files import is_trace_name
    from .readers.kineto import load_trace
    from .readers.model import TraceError

    seqs: dict[int, list[tuple[int, str, str]]] = {}  # rank -> [(seq, name, pg name)]
    for p in sorted(directory.iterdir()):
        if not (p.is_file() and is_trace_name(p.name) and p.name.endswith((".json", ".json.gz"))):
            continue
        try:
            t = load_trace(p)
        except TraceError:
            continue  # not a Kineto trace (a dump's JSON form, a stacks file): nothing to join
        for i in (t.arg_seq >= 0).nonzero()[0].tolist():
            args = t.arg_dicts[t.arg_row[i]] if t.arg_row[i] >= 0 else {}
            seqs.setdefault(t.rank, []).append((int(t.arg_seq[i]), str(args.get("Collective name") or t.names[t.name_id[i]]),
                                                str(args.get("Process Group Name", ""))))
    for f in findings:
        if f.get("seq") is None:
            continue
        before = {}
        for r in f["ranks"]:
            ops = sorted({(q, n) for q, n, pg in seqs.get(r, ()) if q <= f["seq"] and pg in ("", f["group"])})
            if ops:
                before[str(r)] = [{"seq": q, "op": n} for q, n in ops[-keep:]]
        if before:
            f["before"] = before


def analyze_hang(path: str | Path) -> dict:
    """A run bundle (its flight_recorder/ and the ranks' logs) or a directory of dumps."""
    path = Path(path)
    if not path.exists():
        raise DumpError(f"{path}: no such file or directory")
    fr = path / FLIGHT_RECORDER if (path / MANIFEST).exists() else path
    if (path / MANIFEST).exists() and not fr.is_dir():
        raise DumpError(f"{path}: a bundle without Flight Recorder records (flight_recorder/ is written when a rank "
                        f"hangs or fails)")
    if path.is_file():
        dumps = [load_dump(path)]
    else:
        dumps = load_dir(fr)
    logs = {}
    for d in (path / "ranks", fr):
        if d.is_dir():
            for p in d.glob("rank*.log"):
                m = re.fullmatch(r"rank(\d+)\.log", p.name)
                if m:
                    logs[int(m.group(1))] = p.read_text(errors="replace")[-20000:]
    result = diagnose(dumps, logs, str(path))
    if path.is_dir():
        last_collectives(path, result["findings"])
    return result
