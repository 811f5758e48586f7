"""Hang forensics: which rank, which group, which collective, where: from the Flight Recorder
records of every rank (readers/flight_recorder.py), one finding per process group, ranked by cause
(hang_cause.py: the root first, the groups blocked behind it as its consequences).

Per group, collectives are matched across its ranks by their sequence number (the group's own
counter, `collective_seq_id`; a host op's `Seq` in a Kineto trace is the same counter), and each
rank's progress is read from its entries and its pg_status together (hang_records.progress: a
trimmed ring is trimmed, not absent). The group's finding is at the first sequence number no rank
completed (a rank's completion means every member took part):
- `type_mismatch`, `size_mismatch`, `dtype_mismatch`: the ranks called different collectives, or
  the same one with other sizes or element types, at one sequence number (the first such); an
  all-to-all's inputs differ by design, so only its totals must agree;
- `device_stalled`: some ranks' records leave undone a collective their peers completed: their GPU
  stopped completing work (the ranks that then never entered the next one are named too);
- `missing_rank`: some ranks entered a collective that others never enqueued;
- `stuck_in_transfer`: every rank entered and none completed (a peer or link fault only where
  nothing before it holds any member: else a consequence);
- `no_records`: ranks that left no records of the group, so whether they entered cannot be told;
- `rank_died`: a rank left no records (it died); its own last error line where its log has one
  (gloo's "Received data size doesn't match expected size" makes it a `size_mismatch`).
Each finding names the axis and the group's ranks, the op, the sequence number, the ranks
concerned and each rank's stack line (file:line) where it waits; with NCCL's timings, who started
last and how long the others waited.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from commprobe.common.bundle import FLIGHT_RECORDER, MANIFEST

from .hang_cause import parted_at, pending_of, rank_by_cause
from .hang_records import (
    SCHEMA,
    _by_seq,
    _died_evidently,
    _faulthandler_stack,
    _index,
    _last,
    _last_words,
    _main_stack,
    _members,
    _stack_of,
    progress,
    short,
)
from .readers.flight_recorder import DumpError, RankDump, load_dir, load_dump

_GLOO_SIZE = re.compile(r"(\d+) vs (\d+)\. Received data size doesn't match expected size")
def _finding(kind, pg, axis, members, seq, op, concerned, missing, stacks, summary, **extra) -> dict:
    return {"kind": kind, "group": pg, "axis": axis, "ranks": members, "seq": seq, "op": op, "concerned": concerned,
            "missing": missing, "stacks": {str(r): s for r, s in sorted(stacks.items())}, "summary": summary, **extra}


def _label(axis: str | None, op: str) -> str:
    return f"{axis.upper()} {op}" if axis and axis != "world" else op


_ALL_TO_ALL = re.compile(r"all_?to_?all|alltoall", re.IGNORECASE)


def _numel(sizes) -> int:
    n = 0
    for shape in sizes if isinstance(sizes, list) else []:
        k = 1
        for x in shape:
            k *= max(int(x), 0)
        n += k
    return n


def _mismatch(pg, axis, members, group, have, seqs, by_rank) -> list[dict]:
    """Different calls at one sequence number (the first one where they differ). An all-to-all's
    inputs differ by design (MoE dispatch: each rank sends what its tokens routed); only its op,
    element type and the group's totals (what all send = what all receive) must agree."""
    common = sorted(set.intersection(*(set(s) for s in seqs.values()))) if len(seqs) > 1 else []
    for s in common:
        es = {r: seqs[r][s] for r in have}
        a2a = all(_ALL_TO_ALL.search(e["op"]) for e in es.values())
        for key, kind in (("op", "type_mismatch"), ("input_sizes", "size_mismatch"), ("input_dtypes", "dtype_mismatch")):
            if key == "input_sizes" and a2a:
                if set(have) != set(members):
                    continue  # a total needs every member's sizes
                sent = sum(_numel(e["input_sizes"]) for e in es.values())
                got = sum(_numel(e["output_sizes"]) for e in es.values())
                if sent == got or not got:
                    continue
                vals = {r: [e["input_sizes"], e["output_sizes"]] for r, e in es.items()}
                what = f"the group sends {sent:,} elements in all and receives {got:,}"
            else:
                vals = {r: e.get(key) for r, e in es.items()}
                if len({json.dumps(v) for v in vals.values()}) <= 1:
                    continue
                what = ("ranks disagree on " + ("the op" if key == "op" else key.replace("input_", "input ")) + ": "
                        + ", ".join(f"rank {r}: {v}" for r, v in vals.items()))
            stacks = {r: _stack_of(by_rank[r], es[r]) for r in have}
            return [_finding(kind, pg, axis, members, s, es[have[0]]["op"], sorted(vals), [], stacks,
                             f"{_label(axis, es[have[0]]['op'])} seq {s} ({group}): {what}",
                             values={str(r): v for r, v in vals.items()})]
    return []


def _at(ranks: list[int], stacks: dict, verb: str) -> str:
    """'rank 4 waits in it at a.py:3, ranks 0, 1, 7 wait in it at b.py:9': ranks grouped by place."""
    by: dict[str, list[int]] = {}
    for r in ranks:
        by.setdefault(short(stacks.get(r)), []).append(r)
    one, many = verb.split("|")
    return ", ".join(f"rank {rs[0]} {one} at {w}" if len(rs) == 1 else f"ranks {', '.join(map(str, rs))} {many} at {w}"
                     for w, rs in by.items())


def _op_at(seqs: dict[int, dict[int, dict]], s: int, ranks) -> str:
    return next((seqs[r][s]["op"] for r in ranks if s in seqs[r]), "?")


def _group_findings(pg: str, dumps: list[RankDump], logs: dict[int, str]) -> list[dict]:
    members, axis = _members(pg, dumps)
    by_rank = {d.rank: d for d in dumps}
    have = [r for r in members if r in by_rank and by_rank[r].records]
    seqs = {r: _by_seq(by_rank[r], pg) for r in have}
    group = f"group {members}"
    found = _mismatch(pg, axis, members, group, have, seqs, by_rank)
    if found:
        return found
    prog = {r: progress(by_rank[r], pg) for r in have}
    known = [r for r in have if prog[r][0] is not None and prog[r][1] is not None]
    dead = [r for r in members if r not in have and _died_evidently(by_rank.get(r), logs.get(r, ""))]
    absent = [r for r in members if r not in known and r not in dead]
    c_max = max((prog[r][1] for r in known), default=-1)
    s = c_max + 1  # the first sequence number no rank completed: any rank's completion means all took part
    entered = [r for r in known if prog[r][0] >= s]
    if dead:  # a rank died: where the others were then, and what its own log says
        return _dead_findings(pg, axis, members, group, dead, have, seqs, by_rank, logs,
                              s if entered else max((max(sq) for sq in seqs.values() if sq), default=None))
    # ranks whose own records leave undone what a peer completed: their device stopped completing work
    lagging = {r: prog[r][1] + 1 for r in known if prog[r][1] < c_max}
    missing = [r for r in known if prog[r][0] < s]
    if not entered:
        if not lagging:
            return []
        q = min(lagging.values())
        return [_stalled_finding(pg, axis, members, group, q, _op_at(seqs, q, known), lagging, [], [], c_max,
                                 {r: _stack_of(by_rank[r], seqs[r].get(lagging.get(r, s))) for r in have},
                                 _op_at(seqs, q, known))]
    op = _op_at(seqs, s, entered)
    stacks = {r: _stack_of(by_rank[r], seqs[r].get(s, seqs[r].get(lagging.get(r, -1))) or _last(by_rank[r]))
              for r in have}
    waits = _at([r for r in entered if r not in lagging], stacks, "waits in it|wait in it")
    if lagging:
        first = min(lagging.values())
        return [_stalled_finding(pg, axis, members, group, s, op, lagging, missing, entered, c_max, stacks,
                                 _op_at(seqs, first, known))]
    if absent and not missing:
        return [_finding("no_records", pg, axis, members, s, op, entered, absent, stacks,
                         f"{_label(axis, op)} seq {s} ({group}) did not complete: {waits}; rank(s) "
                         f"{', '.join(map(str, absent))} left no Flight Recorder records of it, so whether they "
                         f"entered it cannot be told")]
    if missing:
        live = [r for r in missing if _main_stack(by_rank[r])]
        at = ", ".join(x for x in (_at(live, stacks, "is|are"), _at([r for r in missing if r not in live], stacks,
                                   "last called a collective|last called a collective")) if x)
        who = "rank" if len(missing) == 1 else "ranks"
        return [_finding("missing_rank", pg, axis, members, s, op, entered, missing, stacks,
                         f"{who} {', '.join(map(str, missing))} never entered {_label(axis, op)} seq {s} ({group}); "
                         f"{waits}; {at}")]
    extra = {}
    started = {r: seqs[r][s].get("time_discovered_started_ns") for r in entered if s in seqs[r]}
    if all(isinstance(v, int) and v > 0 for v in started.values()) and len(started) > 1:
        last = max(started, key=started.get)
        extra = {"started_last": last, "waited_s": {str(r): (started[last] - t) / 1e9 for r, t in started.items()}}
    return [_finding("stuck_in_transfer", pg, axis, members, s, op, entered, [], stacks,
                     f"every rank of {group} entered {_label(axis, op)} seq {s} and none completed: a peer or link "
                     f"fault, not the program" + (f"; rank {extra['started_last']} started last" if extra else ""),
                     **extra)]


def _stalled_finding(pg, axis, members, group, s, op, lagging, missing, entered, c_max, stacks, first_op) -> dict:
    """Ranks whose records leave undone collectives their peers completed: the collective did
    complete (no rank completes one the others did not take part in), so their device stopped
    completing work after running it, or their watchdog stopped seeing it."""
    ranks = sorted(lagging)
    who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
    first = min(lagging.values())
    peers = [r for r in members if r not in lagging and r in stacks]
    text = (f"{who} stopped completing GPU work: {_label(axis, first_op)} seq {first} ({group}) is "
            f"not completed in {'its' if len(ranks) == 1 else 'their'} records though rank(s) "
            f"{', '.join(map(str, peers)) or '?'} completed through seq {c_max}")
    if missing:
        text += (f"; {who if set(missing) == set(ranks) else 'rank(s) ' + ', '.join(map(str, missing))} never "
                 f"entered {_label(axis, op)} seq {s}")
    waits = [r for r in entered if r not in lagging]
    if waits:
        text += "; " + _at(waits, stacks, "waits in it|wait in it")
    return _finding("device_stalled", pg, axis, members, s if missing or waits else first, op, waits, sorted(missing),
                    stacks, text, stalled={str(r): q for r, q in sorted(lagging.items())}, completed_through=c_max)


def _dead_findings(pg, axis, members, group, dead, have, seqs, by_rank, logs, s) -> list[dict]:
    op = next((sq[s]["op"] for sq in seqs.values() if s in sq), None) if s is not None else None
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


def _died(pg, axis, members, r, stack: dict | None, log: str | None, seq=None, op=None, waits: str = "") -> dict:
    words = _last_words(log)
    when = f" while its group {members} was at {_label(axis, op)} seq {seq}" if op else ""
    return _finding("rank_died", pg, axis, members, seq, op, [r], [r], {r: stack},
                    f"rank {r} died at {short(stack)}{when}, leaving no Flight Recorder records"
                    + (f"; its last words: {words}" if words else "") + (f"; {waits}" if waits else ""))


def _as_consequence(f: dict) -> None:
    """A consequence's words say what holds it, not a cause of its own."""
    b = f["blocked_by"]
    if f["kind"] == "stuck_in_transfer":
        f["summary"] = f["summary"].replace(": a peer or link fault, not the program", "")
    how = "held" if f.get("certain", True) else ("probably held (through a send or recv whose completion its records "
                                                 "do not keep)")
    f["summary"] += f"; {how} behind {b['op']} seq {b['seq']} of group {b['ranks']} ({b['kind']}, the root above)"


def diagnose(dumps: list[RankDump], logs: dict[int, str] | None = None, source: str = "") -> dict:
    """The findings over all ranks' records (JSON schema commprobe.hang/2): the root causes first,
    ordered by when the ranks parted, each with the groups blocked behind it as `consequences`."""
    logs = logs or {}
    if not dumps:
        raise DumpError(f"{source}: no Flight Recorder dumps")
    _check_one_job(dumps, source)
    pgs = sorted({e["pg_name"] for d in dumps for e in d.entries} | {pg for d in dumps for pg in _index(d)["status"]},
                 key=lambda p: (len(p), p))
    findings, groups = [], {}
    for pg in pgs:
        members, axis = _members(pg, dumps)
        groups[pg] = {"axis": axis, "ranks": members}
        findings += _group_findings(pg, dumps, logs)
    if not pgs:  # no records at all: only the stacks of ranks that raised
        for d in dumps:
            if _died_evidently(d, logs.get(d.rank, "")):
                findings.append(_died("?", None, [], d.rank, _main_stack(d), logs.get(d.rank) or d.error))
    members = {pg: g["ranks"] for pg, g in groups.items()}
    pending = {d.rank: pending_of(d, members) for d in dumps if d.records}
    roots = rank_by_cause(findings, pending, {id(f): parted_at(f, dumps) for f in findings})
    for r in roots:
        for c in r["consequences"]:
            _as_consequence(c)
    notes = []
    ranks = [d.rank for d in dumps if d.records]
    expected = sorted({r for g in groups.values() for r in g["ranks"]})
    absent = [r for r in expected if r not in ranks]
    if absent:
        notes.append(f"no records from rank(s) {absent}: a partial answer from ranks {ranks}")
    return {"schema": SCHEMA, "source": source, "ranks": ranks, "groups": groups, "findings": roots, "notes": notes}


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


def _is_ras(path: Path) -> bool:
    from .readers.nccl_ras import looks_like

    try:
        with path.open("rb") as f:
            return looks_like(f.read(4096))
    except OSError:
        return False


def analyze_hang(path: str | Path) -> dict:
    """A run bundle (its flight_recorder/ and the ranks' logs) or a directory of dumps."""
    path = Path(path)
    if not path.exists():
        raise DumpError(f"{path}: no such file or directory")
    fr = path / FLIGHT_RECORDER if (path / MANIFEST).exists() else path
    if (path / MANIFEST).exists() and not fr.is_dir():
        raise DumpError(f"{path}: a bundle without Flight Recorder records (flight_recorder/ is written when a rank "
                        f"hangs or fails)")
    if path.is_file() and _is_ras(path):  # NCCL RAS status saved to a file (hang_ras.py)
        from .hang_ras import from_file

        return from_file(path)
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
