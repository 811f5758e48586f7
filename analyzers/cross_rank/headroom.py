"""What switching would save: each collective's achieved transfer time against every backend this
machine's calibration measured at that op, group size and message size, rolled up per phase into
µs per window (per token in decode), and the share of the phase's time.

Only *transfer* can be saved by a faster backend: a call's time waiting for a late rank stays
(matching.match splits the two). Only *exposed* transfer counts: the part of a category's time that
compute hides would not shorten a step (each category's exposed share, per rank and phase, scales
its saving). What a rank saves is averaged over the ranks (a collective finishes together).

Conditions. A calibration is measured somewhere: a sweep (`commprobe bench collectives --json`,
back-to-back calls, no profiler) or a healthy profiled run per backend (a `profile --backend
gloo,dda` bundle). A profiled trace's call carries costs a sweep leaves out (profiler spans, a
Python wrapper: DDA 3 µs in a sweep, 17 µs in a trace here). When the calibration also measured the
trace's own backend, that cost is measured, per op: the median of (achieved - calibrated own) over
the matched calls, floored at 0, added to every backend's calibrated time (`conditions_offset_us`).
A negative difference (the trace faster than its own calibration: gloo back-to-back in a sweep,
2 ms, against 0.4-0.8 ms between a model's layers) is reported, not used: the calibration was taken
under other conditions, and the result says so.
"""

from __future__ import annotations

import numpy as np

from .cause import lookup
from .matching import size_bucket

RULE = ("saving per call = its transfer and the waiting its transport carried over (waiting for a late rank "
        "left out) - the target backend's calibrated mean cost at the call's op, group size and message size "
        "(+ the conditions offset); scaled by the category's exposed share; summed per window, averaged over ranks")


def targets(calls, rows: list[dict], n_ranks: int) -> dict[str, np.ndarray]:
    """Per backend in the calibration, each call's calibrated time (µs; NaN where the calibration
    has no row for its op)."""
    if not len(calls):
        return {}
    ops = calls.op()
    out = {}
    for b in sorted({r["backend"] for r in rows if r.get("backend")}):
        t = np.full(len(calls), np.nan)
        for op in set(ops.tolist()):
            sel = ops == op
            gs = int(np.median(calls.group_size[sel])) if sel.any() else 0
            t[sel] = lookup(rows, b, op, gs if gs > 0 else n_ranks, calls.bytes[sel].astype(float), "mean_us")
        out[b] = t
    return out


def conditions(calls: dict, waits: dict, costs: dict, tgt: dict,
               own: str | None) -> tuple[dict[str, float], dict[str, float]]:
    """Per op: (the offset added to every backend's calibrated time, the measured difference
    before flooring), over the matched calls. Empty without the own backend in the calibration."""
    if not own:
        return {}, {}
    diff: dict[str, list] = {}
    for r, c in calls.items():
        t = tgt.get(r, {}).get(own)
        if t is None or r not in waits or not len(c):
            continue
        tr = np.where(np.isnan(waits[r][1]), np.nan, costs[r])
        ok = ~np.isnan(tr) & ~np.isnan(t)
        ops = c.op()
        for op in set(ops[ok].tolist()):
            m = ok & (ops == op)
            diff.setdefault(op, []).append(tr[m] - t[m])
    raw = {op: float(np.median(np.concatenate(v))) for op, v in diff.items()}
    return {op: max(0.0, d) for op, d in raw.items()}, raw


def call_savings(cost: np.ndarray, target: np.ndarray, ops: np.ndarray, offset: dict[str, float]) -> np.ndarray:
    """Per call, what switching to a backend saves: its cost (matching.cost) less the backend's
    calibrated time (`target`, NaN where uncalibrated) and the conditions offset at its op."""
    off = np.zeros(len(ops))
    for op in set(ops.tolist()):
        off[ops == op] = offset.get(op, 0.0)
    return cost - target - off


def accumulate(rk: dict, phase: str, cat: str, sel: np.ndarray, ops: np.ndarray, achieved: np.ndarray,
               tgt: dict, offset: dict[str, float]) -> None:
    """Add a rank's calls `sel` (in the phase's windows, of category `cat`; per call its op and its
    cost, matching.cost) to the phase's `switch_calls["cat|op"]`: calls, their cost (µs) and, per
    backend, the saving over the calls it covers."""
    saves = {b: call_savings(achieved, t, ops, offset) for b, t in tgt.items()}
    for op in set(ops[sel].tolist()):
        m = sel & (ops == op)
        acc = rk["phases"][phase].setdefault("switch_calls", {}).setdefault(
            f"{cat}|{op}", {"calls": 0, "achieved_us": 0.0, "saved_us": {}, "covered": {}})
        acc["calls"] += int(m.sum())
        acc["achieved_us"] += float(achieved[m].sum())
        for b, t in tgt.items():
            ok = m & ~np.isnan(t)
            if ok.any():
                acc["saved_us"][b] = acc["saved_us"].get(b, 0.0) + float(saves[b][ok].sum())
                acc["covered"][b] = acc["covered"].get(b, 0) + int(ok.sum())


def _exposed_share(p: dict, key: str) -> float:
    """The exposed share of the category of `key` ("cat|op") in phase `p`: what compute hides
    would not shorten a window."""
    c = p["categories"].get(key.split("|", 1)[0]) or {}
    return min(1.0, c["exposed_us"] / c["total_us"]) if c.get("total_us") else 1.0


def saved(ranks: list[dict], phase: str, backend: str, keys=None) -> dict:
    """A phase's saving from switching the calls `keys` ("cat|op" predicate; all when None) to
    `backend`: µs per window averaged over ranks (exposed share applied), the calls it covers and
    those it could not (no calibration at their op)."""
    us, calls, covered, e2e, n = 0.0, 0, 0, 0.0, 0
    per_cat: dict[str, float] = {}
    for rk in ranks:
        p = rk["phases"].get(phase)
        if not p or not p["windows"]:
            continue
        n += 1
        e2e += p["e2e_us"] / p["windows"]
        for key, acc in (p.get("switch_calls") or {}).items():
            if keys is not None and not keys(key):
                continue
            cat = key.split("|", 1)[0]
            s = acc["saved_us"].get(backend, 0.0) * _exposed_share(p, key) / p["windows"]
            us += s
            per_cat[cat] = per_cat.get(cat, 0.0) + s
            calls += acc["calls"]
            covered += acc["covered"].get(backend, 0)
    if not n:
        return {"saved_us_per_window": 0.0, "share": 0.0, "calls": 0, "covered": 0, "by_category": {}}
    e2e /= n
    return {"saved_us_per_window": us / n, "share": us / n / e2e if e2e else 0.0, "calls": calls,
            "covered": covered, "by_category": {k: v / n for k, v in sorted(per_cat.items())}}


def outside_calls(ranks: list[dict]) -> dict[str, float]:
    """Per phase, the time per window outside what the collective calls account for (their transfer
    and carried waiting, exposed share applied): compute, copies, idle, waiting for late ranks, and
    communication outside any call, averaged over ranks. Measured under each backend in a
    calibration run of both, its ratio is the backend's cost outside its calls: on 2 cores gloo's
    polling threads slow the ranks' compute (TP decode 756-952 µs per step under gloo against
    411-429 under DDA, idle 764-1,055 against 386-432) and its own thread events take 1.9-4.7 ms a
    CP prefill outside any call; no per-call figure shows either."""
    out: dict[str, list] = {}
    for rk in ranks:
        for ph, p in rk["phases"].items():
            if not p["windows"]:
                continue
            calls = sum(acc["achieved_us"] * _exposed_share(p, key) for key, acc in (p.get("switch_calls") or {}).items())
            out.setdefault(ph, []).append(max(0.0, p["e2e_us"] - calls) / p["windows"])
    return {ph: float(np.mean(v)) for ph, v in out.items()}


def window_times(ranks: list[dict]) -> dict[str, float]:
    """Per phase, the trace's time per window (µs), averaged over ranks."""
    out: dict[str, list] = {}
    for rk in ranks:
        for ph, p in rk["phases"].items():
            if p["windows"]:
                out.setdefault(ph, []).append(p["e2e_us"] / p["windows"])
    return {ph: float(np.mean(v)) for ph, v in out.items()}


def unprofiled_ratio(ranks: list[dict], unprofiled_ms: dict[str, float]) -> dict[str, float]:
    """Per phase, the run's un-profiled median (TTFT, TTIT: the ranks' own clocks, no profiler) per
    µs of its trace's window: what the profiler adds, measured. It is the backend's: DDA's call is
    many small recorded ops (trace 0.9-1.0 ms per TP=2 decode step against 0.50-0.55 ms un-profiled,
    0.53-0.57), gloo's few long ones (0.62-0.97)."""
    return {ph: unprofiled_ms[PHASE_METRIC[ph]] * 1e3 / w for ph, w in window_times(ranks).items()
            if PHASE_METRIC.get(ph) in unprofiled_ms and w > 0}


def median_per_run(rows: list[dict], key: str) -> dict[str, dict[str, float]]:
    """Per backend and phase, the median over the calibration's runs of a per-phase figure each
    run's rows carry (`key`, with the run's path): one run's figure moves with the machine's spells
    (a TP=2 DDA calibration run read 1,131 µs per step outside its calls against 810-1,363 in three
    later runs), several steady it."""
    runs: dict[str, dict[str, dict]] = {}
    for r in rows:
        if r.get(key):
            runs.setdefault(r["backend"], {})[r["run"]] = r[key]
    out: dict[str, dict[str, float]] = {}
    for b, per in runs.items():
        phases = {ph for o in per.values() for ph in o}
        out[b] = {ph: float(np.median([o[ph] for o in per.values() if ph in o])) for ph in phases}
    return out


def values_per_run(rows: list[dict], key: str) -> dict[str, dict[str, list[float]]]:
    """Per backend and metric, each calibration run's figure (`key`: a dict of metric -> value per
    run), one per run: the un-profiled TTFT/TTIT the calibration measured (whatif.py)."""
    runs: dict[str, dict[str, dict]] = {}
    for r in rows:
        if r.get(key):
            runs.setdefault(r["backend"], {})[r["run"]] = r[key]
    return {b: {m: [o[m] for o in per.values() if m in o] for m in sorted({m for o in per.values() for m in o})}
            for b, per in sorted(runs.items())}


def summary(ranks: list[dict], backends: list[str], own: str | None, offset: dict, raw_offset: dict,
            source: str, outside: dict | None = None, unmatched: tuple[int, int] = (0, 0),
            unprofiled: dict | None = None, same_job: dict | None = None) -> dict:
    """The result's `headroom`: per phase, each backend's saving and the best one; the rule, the
    conditions the calibration was measured under, and how many calls (of all) no other rank's
    trace matched: their whole duration is their cost, waiting included (one rank's trace cannot
    tell waiting from transfer), so what they would save is an upper bound."""
    phases = {}
    windows = window_times(ranks)
    names = sorted({ph for rk in ranks for ph, p in rk["phases"].items() if p.get("switch_calls")})
    for ph in names:
        per = {b: saved(ranks, ph, b) for b in backends}
        # the best among the backends that have a calibrated time for any of the phase's calls (a
        # backend that covers none saves 0 by not being measured, not by being no faster)
        measured = [b for b in backends if per[b]["covered"]]
        best = max(measured, key=lambda b: per[b]["saved_us_per_window"]) if measured else None
        e2e_mean = windows.get(ph, 0.0)
        head = max(0.0, per[best]["saved_us_per_window"]) if best else 0.0
        phases[ph] = {"e2e_us_per_window": e2e_mean, "backends": per, "best": best, "headroom_us_per_window": head,
                      "headroom_share": head / e2e_mean if e2e_mean > 0 else 0.0}
    off_note = [f"{op}: {d:+.1f} µs" for op, d in sorted(raw_offset.items()) if own and d < 0]
    lone, total = unmatched
    notes = [f"the calibration's {own} differs from this trace's calls ({', '.join(off_note)} per call, achieved "
             "minus calibrated): it was measured under other conditions (a sweep's back-to-back calls against a "
             "profiled model's); savings are estimates, a profiled run per backend calibrates better"] if off_note else []
    if lone:
        notes.append(f"{lone} of {total} calls matched no other rank's: their whole duration is counted, waiting for "
                     "late ranks included (transfer and waiting cannot be told apart without the other ranks' "
                     "traces), so their saving is an upper bound")
    return {"calibration": source, "backends": backends, "own_backend": own, "conditions_offset_us": offset,
            "outside_calls_us_per_window": outside or {}, "trace_outside_calls_us_per_window": outside_calls(ranks),
            "unprofiled_per_trace_us": unprofiled or {},
            # per backend and metric, the un-profiled times of the calibration's runs of this very job
            "same_job_measured_ms": same_job or {},
            "measured_difference_us": raw_offset, "rule": RULE, "unmatched_calls": lone, "calls": total,
            "notes": notes, "phases": phases}


CATEGORY_WORDS = {"tp_allreduce": "TP allreduce", "cp_ring": "CP ring attention", "ep_all_to_all": "EP all-to-all",
                  "dp_allreduce": "DP allreduce"}
PHASE_METRIC = {"prefill": "ttft", "decode": "ttit"}
PHASE_WORDS = {"decode": ("token", "TTIT"), "prefill": ("prefill", "TTFT")}


def advice(summary_: dict, phase: str, min_share: float = 0.01) -> str | None:
    """The advice line with its figure: what switching to the best calibrated backend saves in
    this phase, where it beats the trace's own backend by at least `min_share` of the phase."""
    p = (summary_.get("phases") or {}).get(phase)
    if not p or not p["best"] or p["best"] == summary_.get("own_backend") or p["headroom_share"] < min_share:
        return None
    s = p["backends"][p["best"]]
    top = max(s["by_category"].items(), key=lambda kv: kv[1])[0] if s["by_category"] else None
    unit, metric = PHASE_WORDS.get(phase, ("window", f"the {phase} time"))
    what = CATEGORY_WORDS.get(top, top or "its collectives")
    bound = ("; at most: most calls matched no other rank's, so their waiting is counted too"
             if summary_.get("unmatched_calls", 0) * 2 > summary_.get("calls", 0) else "")
    if not summary_.get("own_backend"):  # another engine's trace: its collectives are its own to change
        return (f"{what} here is ~{p['headroom_us_per_window'] / 1e3:.2f} ms per {unit} ({p['headroom_share']:.0%} of "
                f"{metric}) slower than {p['best']} measured on this machine at these message sizes (headroom only: "
                f"the engine's own collectives, which commprobe cannot switch; calibration: {summary_['calibration']}"
                f"{bound})")
    return (f"switching {what} to {p['best']} saves ~{p['headroom_us_per_window'] / 1e3:.2f} ms per {unit}, "
            f"{p['headroom_share']:.0%} of {metric}, at these message sizes (calibration: {summary_['calibration']}; "
            f"`commprobe plan --from` predicts it{bound})")


def collectives(calls: dict, costs: dict, tgt: dict, offset: dict) -> list[dict]:
    """Per (op, axis, group size, size bucket): calls, their cost (median; matching.cost), each
    backend's calibrated time there (+ offset), the best backend and the headroom per call."""
    groups: dict[tuple, dict] = {}
    for r, c in calls.items():
        if not len(c) or r not in costs:
            continue
        achieved = costs[r]
        bucket = size_bucket(c.bytes)
        for i, (op, axis, _cat, _src) in enumerate(c.kinds):
            sel = c.kind == i
            for bk in set(bucket[sel].tolist()):
                m = sel & (bucket == bk)
                gs = int(np.median(c.group_size[m])) or len(calls)
                g = groups.setdefault((op, axis, gs, int(bk)), {"achieved": [], "t": {}})
                g["achieved"].append(achieved[m])
                for b, t in tgt.get(r, {}).items():
                    g["t"].setdefault(b, []).append(t[m])
    rows = []
    for (op, axis, gs, bk), g in sorted(groups.items()):
        a = np.concatenate(g["achieved"])
        times = {}
        for b, ts in g["t"].items():
            t = np.concatenate(ts)
            t = t[~np.isnan(t)]
            if len(t):
                times[b] = float(np.median(t)) + offset.get(op, 0.0)
        best = min(times, key=times.get) if times else None
        med = float(np.median(a))
        rows.append({"op": op, "axis": axis, "group_size": gs, "bytes_bucket": bk, "calls": int(len(a)),
                     "achieved_us": med, "calibrated_us": times, "best_backend": best,
                     "headroom_us": max(0.0, med - times[best]) if best else None})
    return rows


__all__ = ["targets", "conditions", "call_savings", "accumulate", "saved", "summary", "collectives", "advice", "RULE", "PHASE_METRIC"]
