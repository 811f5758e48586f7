"""One merged trace of every rank for Perfetto (or chrome://tracing), with commprobe's findings as
tracks: `commprobe analyze PATH --perfetto OUT.json[.gz]`.

Written in the Chrome trace-event JSON format both open: one process per rank ("rank R", its
coordinates), each rank's original events (from whichever reader read it: Kineto, Nsight, rocpd,
RPD, rocprofv3) on one clock, and per rank the tracks commprobe adds:

    commprobe: phases              each window of each phase, its verdict in the slice's args
    commprobe: exposed <category>  communication (and copies) not overlapped by compute
    commprobe: waiting             per matched collective, the time this rank waited, "waiting
                                   for rank R" (args: the rank, the op, µs)
    commprobe: arrived last        the call of the rank everyone waited for; a flow arrow runs
                                   from it to each rank that waited
    commprobe: switching to <B>    with --calibration, per matched call what backend B would save
                                   (its transfer and carried waiting less B's calibrated time):
                                   the call's last that many µs, args with the figures

The clock is the analysis': µs since the earliest rank's base (`origin_ns`), less each rank's
alignment offset (`--align collective-end`), all stated in the file's metadata (`commprobe`).
Ranks are read one at a time and their events written as they are read, so memory stays within
the analysis' own bound. Strings from traces are written by `json` (escaped), and the file reads
back through commprobe's own reader.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np

from commprobe.common.errors import InputError
from commprobe.common.vocab import CATEGORY_LABEL, a2a_words

from .analysis import SCHEMA, analyze_with_calls
from .cross_rank.headroom import call_savings
from .cross_rank.reduce import Reduced
from .per_rank import intervals as iv
from .per_rank.attribution import exposure
from .per_rank.classify import CATEGORIES, COMM_CODES, MEMCPY, classify, load_rules
from .per_rank.links import link_kernels_to_host_ops
from .per_rank.traffic import a2a_group
from .readers.coordinates import name_coordinates
from .readers.coordinates import table as name_table
from .readers.files import trace_files
from .readers.sources import traces_in

TRACK = 1 << 30  # thread ids of commprobe's tracks: far above any trace's own (tid_id + 1)
PHASES, WAITING, ARRIVED = TRACK, TRACK + 1, TRACK + 2
SWITCH = TRACK + 100  # + k for the calibration's k-th backend
EXPOSED = {c: TRACK + 10 + i for i, c in enumerate((*COMM_CODES, MEMCPY))}


class PerfettoError(InputError):
    pass


def parse_ranks(spec: str | None) -> set[int] | None:
    """`--ranks 0,3,5-7` as a set; None for every rank. One line for anything else."""
    if not spec:
        return None
    out: set[int] = set()
    try:
        for part in spec.split(","):
            a, _, b = part.strip().partition("-")
            out.update(range(int(a), int(b or a) + 1))
    except ValueError:
        raise PerfettoError(f"--ranks {spec!r}: give ranks as 0,3 or 0-3") from None
    return out


class _Writer:
    """The JSON array of events, streamed: one event a line."""

    def __init__(self, path: Path):
        self.path = path
        self.tmp = path.with_name(f".{path.name}.tmp")  # renamed into place when whole
        self.f = gzip.open(self.tmp, "wt", compresslevel=3) if path.name.endswith(".gz") else open(self.tmp, "w")
        self.f.write('{"traceEvents":[\n')
        self.first = True
        self.count = 0

    def add(self, ev: dict) -> None:
        self.f.write(("" if self.first else ",\n") + json.dumps(ev, ensure_ascii=False, allow_nan=False))
        self.first = False
        self.count += 1

    def close(self, meta: dict) -> None:
        self.f.write('\n],"displayTimeUnit":"ms","commprobe":' + json.dumps(meta, allow_nan=False) + "}\n")
        self.f.close()
        os.replace(self.tmp, self.path)

    def abandon(self) -> None:
        self.f.close()
        self.tmp.unlink(missing_ok=True)


def _overlaps(lo: np.ndarray, hi: np.ndarray, spans: list) -> np.ndarray:
    """Which [lo, hi) overlap any of `spans` (sorted, disjoint)."""
    if not spans:
        return np.zeros(len(lo), bool)
    a = np.array([s for s, _ in spans])
    b = np.array([e for _, e in spans])
    k = np.searchsorted(a, hi, side="left") - 1  # the last span starting before the event ends
    return (k >= 0) & (b[np.maximum(k, 0)] > lo)


def export(path: str | Path, out: str | Path, *, ranks: str | None = None, window: str | None = None,
           rules_file: str | None = None, align: str = "base", rank_from: str | None = None,
           threshold: float = 0.2, calibration: str | None = None, jobs: int = 1) -> dict:
    """Write the merged trace; returns the analysis and what was written (events per rank)."""
    out = Path(out)
    if not out.name.endswith((".json", ".json.gz")):
        raise PerfettoError(f"--perfetto {out}: the file name must end in .json or .json.gz")
    wanted = parse_ranks(ranks)
    result, red = analyze_with_calls(path, rules_file=rules_file, align=align, rank_from=rank_from,
                                     threshold=threshold, calibration=calibration, jobs=jobs)
    calls, waits = red.calls, red.waits
    if window is not None and window not in result["phases"]:
        raise PerfettoError(f"--window {window}: this trace's phases are {', '.join(result['phases']) or 'none'}")
    by_file: dict[str, list[dict]] = {}
    for rk in result["ranks"]:  # a rank of a multi-process file (Nsight, rocpd) is "FILE#pid=P,device=D"
        by_file.setdefault(str(rk["file"]), []).append(rk)
    offsets = {int(r): float(v) for r, v in result["collectives"]["offsets_us"].items()}
    rules = load_rules(rules_file) if rules_file else []
    files = trace_files(path)
    coords = name_table([Path(f).name for f in files])
    origin = result["origin_ns"]
    try:
        w = _Writer(out)
    except OSError as e:
        raise PerfettoError(f"--perfetto {out}: cannot write it ({os.strerror(e.errno) if e.errno else e})") from None
    written: dict[int, dict] = {}
    try:
        for f in files:
            mine = [rk for name, rks in by_file.items() if name == str(f) or name.startswith(f"{f}#") for rk in rks]
            for trace in traces_in(f, rank_from):
                rk = _which(mine, trace)
                if rk is None or (wanted is not None and rk["rank"] not in wanted):
                    continue
                r = rk["rank"]
                shift = (trace.origin_ns - origin) / 1000.0 - offsets.get(r, 0.0)
                written[r] = _rank(w, trace, rk, result, shift, window, rules, coords)
                del trace
        for r in sorted(written):  # the waits: matched calls are on the run's clock already
            written[r]["waiting_slices"] = _waits(w, r, calls.get(r), waits.get(r), offsets, written, window,
                                                  result["ranks"])
            written[r]["switch_slices"] = _savings(w, r, calls.get(r), waits.get(r), red, offsets, written,
                                                   window)
        if written:
            _imbalance(w, min(written), calls.get(min(written)), red.traffic, offsets, window)
    except BaseException:
        w.abandon()
        raise
    else:
        meta = {"schema": SCHEMA, "source": result["source"]["path"], "origin_ns": origin, "align": align,
                "offsets_us": {str(r): offsets.get(r, 0.0) for r in sorted(written)},
                "clock": "µs since origin_ns (the earliest rank's base), less each rank's offset",
                "window": window, "ranks": sorted(written),
                "verdicts": {ph: p["verdict"] for ph, p in result["phases"].items()}}
        w.close(meta)
    return {"result": result, "written": written, "events": w.count, "path": str(out)}


def _imbalance(w: _Writer, r: int, calls, traffic: dict, offsets: dict, window: str | None) -> None:
    """A counter track on rank r: each all-to-all call's busiest receiver over the mean (the
    dispatches', cross_rank/traffic.py), at the call's start on r, so the hot steps stand out."""
    if calls is None or not len(calls) or not traffic:
        return
    at = {(a2a_group(calls, i), int(calls.k[i])): float(calls.start[i]) - offsets.get(r, 0.0)
          for i in np.flatnonzero(calls.op() == "all_to_all").tolist()}  # (group, match key) -> start on r
    for phase, t in traffic.items():
        if window and phase != window:
            continue
        for k, imb in t["calls"]:
            if (t["group"], k) in at:
                w.add({"ph": "C", "name": f"{a2a_words(t.get('axis', 'ep'))} imbalance (busiest receiver / mean)",
                       "cat": "commprobe",
                       "ts": round(at[t["group"], k], 3), "pid": r, "args": {"imbalance": round(imb, 4)}})


def _which(mine: list[dict], trace) -> dict | None:
    """The analysis' rank for a trace read again: by the identity the analysis kept (host, pid,
    device), else the next one of its file."""
    ident = trace.extra.get("identity") or {}
    for rk in mine:
        want = rk.get("identity") or {}
        if want and all(ident.get(k) == v for k, v in want.items()):
            mine.remove(rk)
            return rk
    return mine.pop(0) if mine else None


def _rank(w: _Writer, trace, rk: dict, result: dict, shift: float, window: str | None, rules, coords) -> dict:
    r = rk["rank"]
    name_coordinates(trace)
    cls = classify(trace, list(rules), coords)
    link_kernels_to_host_ops(trace, cls)
    ex = exposure(trace, cls)
    coord = rk.get("coordinates") or {}
    label = f"rank {r}" + ("".join(f" {k}={v}" for k, v in coord.items() if k != "engine") if coord else "")
    w.add({"ph": "M", "name": "process_name", "pid": r, "args": {"name": label}})
    w.add({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
    spans = ex.windows.get(window, []) if window else None
    lo, hi = trace.ts, trace.ts + trace.dur
    keep = _overlaps(lo, hi, sorted(spans)) if spans is not None else np.ones(len(lo), bool)
    dev = trace.is_device()
    tids = np.unique(trace.tid_id[keep]) if keep.any() else np.zeros(0, np.int64)
    for t in tids.tolist():
        on_dev = bool(dev[trace.tid_id == t].any())
        w.add({"ph": "M", "name": "thread_name", "pid": r, "tid": int(t) + 1,
               "args": {"name": f"{'device stream' if on_dev else 'host thread'} {t}"}})
    for i in np.flatnonzero(keep).tolist():
        ev = {"ph": "X", "name": trace.names[trace.name_id[i]], "cat": trace.cats[trace.cat_id[i]],
              "ts": round(float(trace.ts[i]) + shift, 3), "dur": round(float(trace.dur[i]), 3), "pid": r,
              "tid": int(trace.tid_id[i]) + 1}
        if trace.arg_row[i] >= 0:
            ev["args"] = trace.arg_dicts[trace.arg_row[i]]
        w.add(ev)
    counts = {"events": int(keep.sum()), "phases": {}, "exposed": {}}
    # commprobe's tracks
    w.add({"ph": "M", "name": "thread_name", "pid": r, "tid": PHASES, "args": {"name": "commprobe: phases"}})
    for ph, sp in ex.windows.items():
        if window and ph != window:
            continue
        verdict = (result["phases"].get(ph) or {}).get("verdict")
        for k, (a, b) in enumerate(sp):
            w.add({"ph": "X", "name": ph, "cat": "commprobe", "ts": round(a + shift, 3), "dur": round(b - a, 3),
                   "pid": r, "tid": PHASES, "args": {"phase": ph, "window": k, "verdict": verdict}})
        counts["phases"][ph] = float(sum(b - a for a, b in sp))
    spans_of = {ph: iv.union(np.array([a for a, _ in sp]), np.array([b for _, b in sp]))
                for ph, sp in ex.windows.items() if sp and (not window or ph == window)}
    for code, ivs in ex.exposed.items():
        cat = CATEGORIES[code]
        label = CATEGORY_LABEL.get(cat, cat)
        total, named = 0.0, False
        for ph, inside_windows in spans_of.items():
            for x, y in zip(*iv.intersect(ivs, inside_windows)):
                if not named:
                    named = True
                    w.add({"ph": "M", "name": "thread_name", "pid": r, "tid": EXPOSED[code],
                           "args": {"name": f"commprobe: exposed {label}"}})
                w.add({"ph": "X", "name": f"exposed {label}", "cat": "commprobe", "ts": round(float(x) + shift, 3),
                       "dur": round(float(y - x), 3), "pid": r, "tid": EXPOSED[code],
                       "args": {"category": cat, "phase": ph}})
                total += float(y - x)
        if total:
            counts["exposed"][cat] = total
    counts["windows"] = {ph: [[a + shift, b + shift] for a, b in sp] for ph, sp in ex.windows.items()}
    return counts


def _waits(w: _Writer, r: int, calls, waits, offsets: dict, written: dict, window: str | None,
           ranks: list[dict]) -> float:
    """Rank r's waiting per matched call ("waiting for rank R", then "held in the call" for the time
    it stayed after the last arriver had left), and from the last arriver's call a flow arrow to it.
    The calls are on the run's clock; each rank's offset applies to its own."""
    if calls is None or waits is None or not len(calls):
        return 0.0
    wait, transfer, last, held = waits[:4]
    sel = ~np.isnan(wait) & (wait > 0)
    if window:
        spans = written[r]["windows"].get(window, [])
        start_al = calls.start - offsets.get(r, 0.0)
        sel &= _overlaps(start_al, start_al + (calls.end - calls.start), sorted(spans))
    if not sel.any():
        return 0.0
    w.add({"ph": "M", "name": "thread_name", "pid": r, "tid": WAITING, "args": {"name": "commprobe: waiting"}})
    ops = [k[0] for k in calls.kinds]
    total = 0.0
    for i in np.flatnonzero(sel).tolist():
        s = float(calls.start[i]) - offsets.get(r, 0.0)
        who, own = int(last[i]), float(held[i])
        us = float(wait[i]) - own
        op = ops[calls.kind[i]]
        if own > 0:  # after the last arriver had left: this rank's own delay inside the call
            w.add({"ph": "X", "name": "held in the call (own delay)", "cat": "commprobe",
                   "ts": round(s + us + float(transfer[i]), 3), "dur": round(own, 3), "pid": r, "tid": WAITING,
                   "args": {"held_us": own, "op": op}})
            total += own
        if us <= 0:
            continue
        w.add({"ph": "X", "name": f"waiting for rank {who}", "cat": "commprobe", "ts": round(s, 3),
               "dur": round(us, 3), "pid": r, "tid": WAITING,
               "args": {"waiting_for": who, "wait_us": us, "op": op}})
        total += us
        if who in written:  # the last arriver's call, and the arrow from it to this wait's end
            arrive = s + us
            flow = f"{r}:{i}"
            w.add({"ph": "X", "name": f"arrived last: {op}", "cat": "commprobe", "ts": round(arrive, 3),
                   "dur": round(float(transfer[i]), 3), "pid": who, "tid": ARRIVED, "args": {"waited_for_by": r}})
            w.add({"ph": "s", "name": "waited for", "cat": "commprobe", "id": flow, "ts": round(arrive, 3),
                   "pid": who, "tid": ARRIVED})
            w.add({"ph": "f", "bp": "e", "name": "waited for", "cat": "commprobe", "id": flow,
                   "ts": round(arrive, 3), "pid": r, "tid": WAITING})
    for who in {int(x) for x in last[sel].tolist()} & set(written):
        w.add({"ph": "M", "name": "thread_name", "pid": who, "tid": ARRIVED,
               "args": {"name": "commprobe: arrived last"}})
    return total


def _savings(w: _Writer, r: int, calls, waits, red: Reduced, offsets: dict, written: dict,
             window: str | None) -> dict[str, float]:
    """Rank r's matched calls, per calibrated backend other than the trace's own: what switching
    would save on each (cross_rank/headroom.py, before the exposed share the phase totals apply),
    drawn as the call's last µs that would go. Returns µs drawn per backend."""
    tgt = (red.targets or {}).get(r) or {}
    cost = (red.costs or {}).get(r)
    if calls is None or waits is None or cost is None or not len(calls):
        return {}
    sel = np.ones(len(calls), bool)  # unmatched calls too, whole (an upper bound: args say so)
    if window:
        spans = written[r]["windows"].get(window, [])
        start_al = calls.start - offsets.get(r, 0.0)
        sel &= _overlaps(start_al, start_al + (calls.end - calls.start), sorted(spans))
    ops = calls.op()
    offset = red.offset or {}
    out = {}
    for k, (b, t) in enumerate(sorted(tgt.items())):
        if b == red.own:
            continue
        save = call_savings(cost, t, ops, offset)
        m = sel & ~np.isnan(t) & (save > 0)
        if not m.any():
            continue
        w.add({"ph": "M", "name": "thread_name", "pid": r, "tid": SWITCH + k,
               "args": {"name": f"commprobe: switching to {b}"}})
        for i in np.flatnonzero(m).tolist():
            end = float(calls.end[i]) - offsets.get(r, 0.0)
            us = float(save[i])
            w.add({"ph": "X", "name": f"{b} saves", "cat": "commprobe", "ts": round(end - us, 3), "dur": round(us, 3),
                   "pid": r, "tid": SWITCH + k,
                   "args": {"saved_us": us, "cost_us": float(cost[i]), "calibrated_us": float(t[i] + offset.get(ops[i], 0.0)),
                            "op": str(ops[i]), "bytes": int(calls.bytes[i]), "matched": bool(~np.isnan(waits[1][i]))}})
        out[b] = float(save[m].sum())
    return out


__all__ = ["export", "parse_ranks", "PerfettoError"]
