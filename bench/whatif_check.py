"""Check `plan --from PATH --what-if backend=B` by running the switch (issue: what switching would save).

Per layout (TP=2 decode, CP=2 prefill, EP=2 prefill: bench diagnosis' layouts), one calibration
bundle (`profile --backend gloo,dda`: each backend's calls measured as the traces measure them),
then --rounds measured bundles, each running gloo then dda in one launch (A B A B ...). From each
round's gloo run the dda time is predicted, and from its dda run the gloo time; predicted and
measured are compared as medians over rounds, for the trace's own time per window (profiled) and
the bundle's un-profiled TTFT/TTIT.

    python bench/whatif_check.py [--rounds 3] [--layouts tp2,cp2,ep2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _profile(layout: str, out: Path) -> None:
    from commprobe.collectives.backends import process_group_backend
    from commprobe.probe.bench.diagnosis import LAYOUTS
    from commprobe.probe.profile import run_profile
    from commprobe.probe.run import RunConfig

    cfg = RunConfig(backends=["gloo", "dda"], repeats=3, out_dir=str(out), timeout=300, seed=0, **LAYOUTS[layout][0])
    run_profile(cfg, cfg.model_config().to_dict(), pg_backend=process_group_backend(cfg.backends), telemetry_interval=1.0)


def check(layout: str, rounds: int, work: Path) -> list[dict]:
    from commprobe.analyzers.analysis import analyze
    from commprobe.analyzers.whatif import predict
    from commprobe.probe.bench.diagnosis import LAYOUTS

    phase = LAYOUTS[layout][1]
    cal = work / f"{layout}-calibration"
    _profile(layout, cal)
    runs = []
    for i in range(rounds):
        _profile(layout, work / f"{layout}-round{i}")
        runs.append(work / f"{layout}-round{i}")
    rows = []
    for src, dst in (("gloo", "dda"), ("dda", "gloo")):
        pred_tr, meas_tr, pred_un, meas_un = [], [], [], []
        for run in runs:
            doc = predict(analyze(run / src, calibration=str(cal)), run / src, f"backend={dst}")
            p = doc["phases"][phase]
            pred_tr.append(p["predicted_us_per_window"])
            pred_un.append(p.get("predicted_ms"))
            other = predict(analyze(run / dst, calibration=str(cal)), run / dst, f"backend={dst}")["phases"][phase]
            meas_tr.append(other["trace_us_per_window"])
            meas_un.append(other.get("measured_ms"))
        med = statistics.median
        row = {"layout": layout, "phase": phase, "from": src, "to": dst, "rounds": rounds,
               "predicted_trace_us": med(pred_tr), "measured_trace_us": med(meas_tr),
               "predicted_ms": med(pred_un) if None not in pred_un else None,
               "measured_ms": med(meas_un) if None not in meas_un else None,
               "per_round": list(zip(pred_tr, meas_tr))}
        row["trace_error"] = row["predicted_trace_us"] / row["measured_trace_us"] - 1
        row["unprofiled_error"] = (row["predicted_ms"] / row["measured_ms"] - 1) if row["measured_ms"] else None
        rows.append(row)
        print(f"{layout} {phase}: {src} → {dst}: trace {row['predicted_trace_us']:,.0f} predicted vs "
              f"{row['measured_trace_us']:,.0f} µs measured ({row['trace_error']:+.0%}); un-profiled "
              f"{row['predicted_ms']:.3f} vs {row['measured_ms']:.3f} ms ({row['unprofiled_error']:+.0%})", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layouts", default="tp2,cp2,ep2")
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--keep", help="Keep the bundles in this directory.")
    a = ap.parse_args()
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="commprobe-whatif-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = [r for lay in a.layouts.split(",") for r in check(lay, a.rounds, work)]
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(rows, indent=1))
    print(f"bundles: {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
