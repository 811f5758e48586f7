"""`plan --from BUNDLE --what-if tp=N` (cp=N, ep=N): another layout of the traced run, predicted.

A layout change moves compute and communication alike, so it needs the model's shapes: a commprobe
bundle's manifest holds them (another engine's trace does not, and is refused in one line). The
cost model is calibrated on the bundle itself (its un-profiled TTFT/TTIT give the machine's compute
rates, plan/calibrate.py) and a sweep of the machine's collectives (its links); the bundle's own
layout and the asked one are both predicted, and the measured times scale by their ratio, so what
the model gets wrong about this machine in absolute terms cancels.

What one layout cannot tell: how its compute splits into work that shards (matmuls over TP) and
per-rank overhead that does not (the interpreter, launches). Measured at one layout the split is
the fit's prior; further bundles of this machine in --calibration (another layout: a TP=1 run)
measure it, and the result says which it was. The tiny model is all overhead (544 ops per decode
step at TP=1 and TP=2 alike, a 64-wide matmul costs its dispatch): one layout's prior halves part
of it and predicts TP=1 too fast.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from commprobe.analyzers import calibration as readcal
from commprobe.common import whatif_spec
from commprobe.common.bundle import read_manifest, sub_bundles

from .calibrate import calibrate, options_of, workload_of
from .costmodel import predict
from .hardware import PlanError


def parse(spec: str) -> tuple[str, int] | None:
    """('tp', 4) for 'tp=4'; None when the spec is not a layout change (the one --what-if parser,
    common/whatif_spec.py)."""
    s = whatif_spec.from_trace(spec)
    return (s.key, int(s.values[0])) if s.kind == "layout" else None


def predict_layout(path: str | Path, spec: str, calibration: str) -> dict:
    key, n = parse(spec) or (None, 0)
    if key is None:
        raise PlanError(f"--what-if {spec}: not a layout change (tp=N, cp=N, ep=N)")
    p = Path(path)
    if not (p.is_dir() and (p / "manifest.json").is_file()):
        raise PlanError(f"--what-if {spec} from {path}: a layout change needs the model's shapes, which only a "
                        "commprobe bundle records (another engine's trace cannot tell them)")
    parts = [str(c) for c in readcal.paths_of(calibration)]
    sweeps = [c for c in parts if Path(c).suffix == ".json"]
    others = [b for c in parts if Path(c).is_dir() for b in _bundles(Path(c)) if b.resolve() != p.resolve()]
    if not sweeps:
        raise PlanError(f"--what-if {spec}: the links need a sweep in --calibration (commprobe bench collectives "
                        "--json > FILE)")
    hw, runs = calibrate([*sweeps, str(p), *map(str, others)], name="from-trace")
    run = runs[0]
    layouts = sorted({(r["layout"].tp, r["layout"].cp, r["layout"].ep) for r in runs})
    notes = [] if len(layouts) > 1 else [
        "one layout measured: how its compute splits into work that shards and per-rank overhead (the interpreter, "
        "launches) is the fit's prior, not measured; a bundle of another layout in --calibration measures it"]
    w, opt, lay = workload_of(run), options_of(run), run["layout"]
    alt_lay = replace(lay, **{key: n})
    base, alt = predict(w, lay, hw, opt), predict(w, alt_lay, hw, opt)
    phases = {}
    for ph, metric in (("prefill", "ttft"), ("decode", "ttit")):
        b, a = getattr(base, f"{metric}_ms"), getattr(alt, f"{metric}_ms")
        measured = run[f"{metric}_ms"]
        phases[ph] = {"metric": metric, "measured_ms": measured, "model_base_ms": b, "model_alt_ms": a,
                      "predicted_ms": measured * a / b if b > 0 else None}
    return {"switch": {"what": key, "value": n}, "from": str(p), "layout": asdict(lay), "to": asdict(alt_lay),
            "calibration": calibration, "rule": "measured x (model at the asked layout / model at the bundle's "
            "layout), the model calibrated on the bundle, the sweep and any bundle in --calibration",
            "calibration_layouts": [{"tp": t, "cp": c, "ep": e} for t, c, e in layouts], "notes": notes,
            "phases": phases}


def _bundles(path: Path) -> list[Path]:
    """A bundle directory's one-backend bundles (each sub-bundle of a multi-backend run); [] for
    anything else."""
    m = read_manifest(path)
    if m is None:
        return []
    subs = sub_bundles(m)
    return [path / d for d in subs.values()] if subs else [path]


def predict_from(path: str | Path, spec: str, calibration: str) -> tuple[str, dict]:
    """The one entry point of a prediction from a trace or bundle: the spec read once, then a
    layout change (this module) or a backend switch (analyzers/whatif.py over the trace analyzed
    against the calibration); each phase's interval from the calibration's rounds (intervals.py).
    Returns (the switch's kind, the prediction)."""
    from .intervals import attach

    s = whatif_spec.from_trace(spec)
    if s.kind == "layout":
        return "layout", attach(predict_layout(path, spec, calibration), calibration, "layout")
    from commprobe.analyzers.analysis import analyze
    from commprobe.analyzers.whatif import predict

    return s.kind, attach(predict(analyze(path, calibration=calibration), path, spec), calibration, s.kind)


__all__ = ["parse", "predict_from", "predict_layout"]
