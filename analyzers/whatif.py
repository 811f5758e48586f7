"""`plan --from PATH --what-if backend=dda`: a trace's phases predicted under another backend.

The trace is analyzed against a calibration that measured the target backend (cross_rank/headroom.py):
each phase's predicted time = its measured time - what switching the selected collectives saves per
window (their transfer and the waiting their transport carried over, less the target's calibrated
cost at their op, group size and size; the exposed share applied). A whole-backend switch also
scales the rest of the window (compute, idle, waiting for late ranks, communication outside any
call) by what the calibration measured of it under each backend, where it ran both: the backend's
cost outside its calls (headroom.outside_calls). The measured time is the trace's own per-window
time and, where the input is a commprobe bundle, its un-profiled TTFT/TTIT too: the predicted trace
time times the target's un-profiled/profiled ratio where the calibration ran the target both ways
(a run bundle), else shrunk by the fraction the trace saves.

Keys: `backend=B` switches every collective the calibration measured; `allreduce=B` (or any op:
all_to_all, send_recv, all_gather) only that op's calls.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from commprobe.common import whatif_spec
from commprobe.common.bundle import unprofiled_medians
from commprobe.common.vocab import PROFILE_BACKENDS

from .cross_rank import headroom
from .cross_rank.headroom import PHASE_METRIC
from .readers import remote
from .readers.model import TraceError

# A calibration's ratio of time outside the calls (target backend over own) counts only beyond this
# machine's run-to-run noise of that time: the same backend's four runs spread 7-16 % (TP=2 decode,
# EP=2 prefill), so a ratio within +-25 % is not told from noise (one EP=2 calibration read 1.13,
# an error of 10 % when applied); TP=2 and CP=2 read 0.46-0.47 and 2.1-2.2 (gloo's threads).
OUTSIDE_NOISE = 0.25


def parse(spec: str) -> tuple[str, str]:
    """'backend=dda' or 'allreduce=dda' -> (what, backend), read by the one --what-if parser
    (common/whatif_spec.py); a layout or model key is one line here."""
    s = whatif_spec.from_trace(spec)
    if s.kind not in ("backend", "op"):
        raise TraceError(f"--what-if {spec!r}: one switch, backend=B or OP=B (allreduce=dda)")
    return s.key, s.values[0]


def predict(result: dict, path: str | Path, spec: str) -> dict:
    """Per phase: measured, saved and predicted times, and the terms used."""
    what, backend = parse(spec)
    h = result.get("headroom")
    if not h:
        raise TraceError("--what-if from a trace needs --calibration: a sweep (`bench collectives --json`) or a "
                         "profiled run per backend (`profile --backend gloo,dda`)")
    if backend not in h["backends"]:
        raise TraceError(f"--what-if {spec}: the calibration measured {', '.join(h['backends']) or 'no backend'}, "
                         f"not {backend}")
    keys = None if what == "backend" else (lambda k: k.split("|", 1)[1] == what)
    unprof = {} if remote.is_url(path) else unprofiled_medians(Path(path))
    profiler = h.get("unprofiled_per_trace_us") or {}
    phases = {}
    for ph in h["phases"]:
        s = headroom.saved(result["ranks"], ph, backend, keys)
        if not s["calls"]:
            continue
        e2e = h["phases"][ph]["e2e_us_per_window"]
        # a whole-backend switch also takes away the backend's communication outside any call
        # (gloo's own threads' events here: other_comm), exposed, per window, averaged over ranks
        # and its cost outside any call: the time outside communication per window scales as the
        # calibration measured it under each backend (a run of both), where it did
        out = h.get("outside_calls_us_per_window") or {}
        mine = (h.get("trace_outside_calls_us_per_window") or {}).get(ph, 0.0)
        ratio = (out[backend][ph] / out[h["own_backend"]][ph]
                 if keys is None and h["own_backend"] in out and backend in out and ph in out[backend]
                 and out[h["own_backend"]].get(ph) else None)
        applied = ratio is not None and abs(ratio - 1) >= OUTSIDE_NOISE
        outside = mine * (1 - ratio) if applied else 0.0
        total = s["saved_us_per_window"] + outside
        row = {"calls": s["calls"], "covered": s["covered"], "by_category": s["by_category"],
               "outside_calls_us_per_window": mine, "outside_calls_ratio": ratio, "outside_calls_applied": applied,
               "outside_calls_saved_us_per_window": outside,
               "trace_us_per_window": e2e, "saved_us_per_window": total,
               "predicted_us_per_window": e2e - total, "share": total / e2e if e2e else 0.0}
        metric = PHASE_METRIC.get(ph)
        if metric and metric in unprof and e2e > 0:
            row["metric"] = metric
            row["measured_ms"] = unprof[metric]
            k = profiler.get(backend, {}).get(ph) if keys is None else None
            if k:
                # the predicted trace time is the target's under the profiler: its un-profiled time
                # is the target's own ratio of the two, which the calibration measured (the
                # profiler adds per recorded op: DDA's ratio 0.53-0.57 per TP=2 decode step, gloo's
                # 0.62-0.97); the trace's own ratio would carry the own backend's
                row["unprofiled_rule"] = (f"predicted trace time x {backend}'s un-profiled/profiled ratio, measured by the "
                                         "calibration's runs of this job")
                row["unprofiled_ratio"] = k
                row["predicted_ms"] = (e2e - total) * k / 1e3
            else:
                # no un-profiled run of this job under the target (a sweep's calibration, a run of
                # another model or layout: its profiler share is its own; one op switched): the same
                # fraction saved as in the trace (the trace's µs cannot be subtracted from an
                # un-profiled time: the profiler's per-call cost differs between the runs)
                row["unprofiled_rule"] = ("the measured un-profiled time less the fraction the trace saves (" + (
                    "one op switched: no run measured that mix" if keys is not None else
                    f"no un-profiled run of this job under {backend} in the calibration") + ")")
                row["predicted_ms"] = unprof[metric] * (1 - total / e2e)
            row["basis"] = "calls"
            _measured_instead(row, h, backend, metric, keys is None)
        phases[ph] = row
    if not phases:
        raise TraceError(f"--what-if {spec}: no {what if keys else 'collective'} calls in the trace's phases")
    notes = list(h["notes"]) + [p["drift"] for p in phases.values() if p.get("drift")]
    missing = sum(p["calls"] - p["covered"] for p in phases.values())
    if missing:
        # calls the calibration has no time for stay as they are: say which, so the figure is read as partial
        uncovered = [c for c in h.get("collectives") or [] if backend not in (c.get("calibrated_us") or {})]
        where = ", ".join(sorted({f"{c['op']} in groups of {c['group_size']}" for c in uncovered}))
        if any(c["group_size"] == 1 for c in uncovered):
            where += "; a one-rank trace records no group size"
        notes.append(f"{missing} of {sum(p['calls'] for p in phases.values())} calls have no calibrated time under "
                     f"{backend} at their op, group size and size and count as unchanged"
                     + (f" ({where})" if where else ""))
    if keys is None and not any(p["outside_calls_ratio"] for p in phases.values()):
        # a sweep (or runs of one backend) measured the calls only: say what that leaves out
        notes.append(f"the calibration measured {backend}'s calls, not what it costs outside them (its threads "
                     "competing with compute, its own events outside any call), so only the calls are predicted"
                     + (f": a run of this job under both backends (`profile --backend {h['own_backend']},{backend}`) "
                        "measures the rest, which a backend whose threads compete with compute makes large "
                        "(docs/prediction.md)" if h["own_backend"] and backend in PROFILE_BACKENDS else ""))
    return {"switch": {"what": what, "backend": backend}, "from": str(path), "own_backend": h["own_backend"],
            "calibration": h["calibration"], "rule": h["rule"], "notes": notes,
            "conditions_offset_us": h["conditions_offset_us"], "phases": phases}


def _measured_instead(row: dict, h: dict, backend: str, metric: str, whole: bool) -> None:
    """Where the calibration ran this very job under the target backend, its measured times are the
    best evidence of what the switch gives: the prediction is their median (`basis` "measured"), the
    calls' figure kept beside it (`from_calls_ms`). Measured here, each of nine rounds predicted from
    the others: the calls' figure carries the traced run's own noise on top of the target's (3-4 of 9
    within 10 % on TP=2 TTIT), the measured median the target's alone. One op switched: no run
    measured that mix. Says where the traced run's own backend lies outside what the calibration
    measured of it (the machine changed since)."""
    runs = (h.get("same_job_measured_ms") or {}).get(backend, {}).get(metric) or []
    if not whole or not runs:
        return
    row["from_calls_ms"] = row["predicted_ms"]
    row["predicted_ms"] = statistics.median(runs)
    row["basis"] = "measured"
    row["unprofiled_rule"] = (f"the calibration ran this job under {backend}: the median un-profiled {metric.upper()} "
                              f"of its {len(runs)} run(s); from the trace's calls {row['from_calls_ms']:.3f} ms")
    own = (h.get("same_job_measured_ms") or {}).get(h.get("own_backend") or "", {}).get(metric) or []
    if len(own) >= 3 and not min(own) <= row["measured_ms"] <= max(own):
        row["drift"] = (f"this run's {h['own_backend']} {metric.upper()} {row['measured_ms']:.3f} ms lies outside the "
                        f"calibration's {min(own):.3f}-{max(own):.3f} ms: the machine may have changed since it was "
                        "calibrated")


__all__ = ["parse", "predict", "PHASE_METRIC"]
