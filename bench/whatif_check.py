"""Check `plan --from PATH --what-if backend=B` by running the switch (issue: what switching would save).

Per layout (TP=2 decode, CP=2 prefill, EP=2 prefill: bench diagnosis' layouts), one calibration
bundle (`profile --backend gloo,dda`: each backend's calls measured as the traces measure them),
then --rounds measured bundles, each running gloo then dda in one launch (A B A B ...). From each
round's gloo run the dda time is predicted, and from its dda run the gloo time, calibrated on the
calibration bundle and the other rounds (never the round predicted); predicted and
measured are compared as medians over rounds, for the trace's own time per window (profiled) and
the bundle's un-profiled TTFT/TTIT.

    python bench/whatif_check.py [--rounds 7] [--layouts tp2,cp2,ep2] [--tp] [--repeats 10] [--profiled-repeats N] [--json OUT] [--keep DIR [--reuse]]

With --tp, also `--what-if tp=1` from TP=2 DDA bundles against TP=1 runs alternated with them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


REUSE = False  # --reuse: bundles already in --keep are re-scored, not run again
REPEATS = 10  # --repeats: un-profiled repetitions per run (each gives one TTFT sample)
PROFILED: int | None = None  # --profiled-repeats: profiled ones (None: the layout's)


def _profile(layout: str, out: Path) -> None:
    if REUSE and (out / "manifest.json").is_file():
        return
    from commprobe.collectives.backends import process_group_backend
    from commprobe.probe.bench.diagnosis import LAYOUTS
    from commprobe.probe.profile import run_profile
    from commprobe.probe.run import RunConfig

    fields = dict(LAYOUTS[layout][0])
    if PROFILED:
        fields["profiled_repeats"] = PROFILED
    cfg = RunConfig(backends=["gloo", "dda"], repeats=REPEATS, out_dir=str(out), timeout=300, seed=0, **fields)
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
        for i, run in enumerate(runs):
            # calibrated on every run but the one predicted: the calibration bundle and the other
            # rounds (a backend's time outside its calls moves with the machine's spells: one run
            # of it is not enough, measured)
            cal_i = ",".join(str(x) for x in [cal, *(r for j, r in enumerate(runs) if j != i)])
            doc = predict(analyze(run / src, calibration=cal_i), run / src, f"backend={dst}")
            p = doc["phases"][phase]
            pred_tr.append(p["predicted_us_per_window"])
            pred_un.append(p.get("predicted_ms"))
            other = predict(analyze(run / dst, calibration=cal_i), run / dst, f"backend={dst}")["phases"][phase]
            meas_tr.append(other["trace_us_per_window"])
            meas_un.append(other.get("measured_ms"))
        med = statistics.median
        spread = [m for m in meas_un if m is not None]
        paired = [p / m - 1 for p, m in zip(pred_un, meas_un) if p is not None and m]
        row = {"layout": layout, "phase": phase, "from": src, "to": dst, "rounds": rounds,
               "predicted_trace_us": med(pred_tr), "measured_trace_us": med(meas_tr),
               "predicted_ms": med(pred_un) if None not in pred_un else None,
               "measured_ms": med(meas_un) if None not in meas_un else None,
               "per_round": list(zip(pred_tr, meas_tr)), "per_round_ms": list(zip(pred_un, meas_un)),
               # the target's own run-to-run spread, un-profiled: what no prediction can beat here
               "measured_spread": (max(spread) / min(spread) - 1) if spread else None,
               # each round against the run beside it in the same launch (a spell of the machine
               # moves both): the median of the per-round errors
               "paired_unprofiled_error": med(paired) if paired else None,
               # the measured median's own uncertainty: the distribution-free interval between the
               # 2nd lowest and 2nd highest of n rounds (87.5 % for n = 7, 94 % for 9): a
               # prediction inside it cannot be told from right by these runs
               "measured_interval_ms": _interval(spread)}
        row["trace_error"] = row["predicted_trace_us"] / row["measured_trace_us"] - 1
        row["unprofiled_error"] = (row["predicted_ms"] / row["measured_ms"] - 1) if row["measured_ms"] else None
        rows.append(row)
        print(f"{layout} {phase}: {src} → {dst}: trace {row['predicted_trace_us']:,.0f} predicted vs "
              f"{row['measured_trace_us']:,.0f} µs measured ({row['trace_error']:+.0%}); un-profiled "
              f"{row['predicted_ms']:.3f} vs {row['measured_ms']:.3f} ms ({row['unprofiled_error']:+.0%}, paired "
              f"{row['paired_unprofiled_error']:+.0%}; {dst}'s own runs spread {row['measured_spread']:.0%}"
              + (f"; the measured median's {row['measured_interval_ms'][2]:.0%} interval "
                 f"{row['measured_interval_ms'][0]:.3f}-{row['measured_interval_ms'][1]:.3f} ms, the prediction "
                 f"{'inside' if row['measured_interval_ms'][0] <= row['predicted_ms'] <= row['measured_interval_ms'][1] else 'outside'}"
                 if row["measured_interval_ms"] else "") + ")", flush=True)
    return rows


def _interval(xs: list[float]) -> tuple[float, float, float] | None:
    """(low, high, coverage) of the median of `xs` without assuming their distribution: the 2nd
    lowest and 2nd highest values, which hold the true median with probability 1 - 2 P(Bin(n, 1/2)
    <= 1); None under 5 values."""
    n = len(xs)
    if n < 5:
        return None
    v = sorted(xs)
    return v[1], v[-2], 1 - 2 * (1 + n) / 2 ** n


def check_tp(rounds: int, work: Path) -> dict:
    """`--what-if tp=1` from TP=2 DDA bundles (tiny, bench diagnosis' tp2 shape), against TP=1 runs
    alternated with them; the links from a 2-rank sweep of this machine."""
    import subprocess

    from commprobe.collectives.backends import process_group_backend
    from commprobe.plan.fromtrace import predict_layout
    from commprobe.probe.bench.diagnosis import LAYOUTS
    from commprobe.probe.profile import run_profile
    from commprobe.probe.run import RunConfig

    sweep = work / "sweep.json"
    r = None if REUSE and sweep.is_file() else subprocess.run([sys.executable, "-m", "commprobe.probe.cli", "bench", "collectives", "--backend", "dda",
                        "--min", "256", "--max", "64K", "--batches", "3", "--json"], capture_output=True, text=True)
    if r is not None:
        sweep.write_text(r.stdout)
    pred, meas = {"ttft": [], "ttit": []}, {"ttft": [], "ttit": []}
    pred2 = {"ttft": [], "ttit": []}
    for i in range(rounds):
        for tp, backend in ((2, "dda"), (1, "gloo")):
            if REUSE and (work / f"layout-tp{tp}-round{i}" / "manifest.json").is_file():
                continue
            fields = {**LAYOUTS["tp2"][0], "tp": tp}
            cfg = RunConfig(backends=[backend], repeats=REPEATS, out_dir=str(work / f"layout-tp{tp}-round{i}"), timeout=300,
                            seed=0, **fields)
            run_profile(cfg, cfg.model_config().to_dict(), pg_backend=process_group_backend(cfg.backends),
                        telemetry_interval=1.0)
    for i in range(rounds):
        doc = predict_layout(work / f"layout-tp2-round{i}", "tp=1", str(sweep))
        # the other rounds' bundles of both layouts in the calibration: the split measured, not the prior's
        others = ",".join(str(work / f"layout-tp{tp}-round{j}") for j in range(rounds) if j != i for tp in (1, 2))
        doc2 = predict_layout(work / f"layout-tp2-round{i}", "tp=1", f"{sweep},{others}") if others else doc
        t1 = json.loads((work / f"layout-tp1-round{i}" / "timings.json").read_text())["ranks"][0]
        for ph, m in (("prefill", "ttft"), ("decode", "ttit")):
            pred[m].append(doc["phases"][ph]["predicted_ms"])
            pred2[m].append(doc2["phases"][ph]["predicted_ms"])
            meas[m].append(t1[f"{m}_median_ms"])
    med = statistics.median
    out = {}
    for m in pred:
        out[m] = {"predicted_ms": med(pred[m]), "measured_ms": med(meas[m]),
                  "predicted_two_layouts_ms": med(pred2[m]),
                  "paired_error": med(p / x - 1 for p, x in zip(pred[m], meas[m])),
                  "paired_error_two_layouts": med(p / x - 1 for p, x in zip(pred2[m], meas[m])),
                  "measured_spread": max(meas[m]) / min(meas[m]) - 1}
        v = out[m]
        v["error"] = v["predicted_ms"] / v["measured_ms"] - 1
        v["error_two_layouts"] = v["predicted_two_layouts_ms"] / v["measured_ms"] - 1
        print(f"tp=2 → tp=1 {m.upper()}: {v['measured_ms']:.3f} ms measured (TP=1 runs spread {v['measured_spread']:.0%}); "
              f"one layout {v['predicted_ms']:.3f} predicted ({v['error']:+.0%}, paired {v['paired_error']:+.0%}); "
              f"with the other rounds' TP=1 and TP=2 runs {v['predicted_two_layouts_ms']:.3f} ({v['error_two_layouts']:+.0%}, "
              f"paired {v['paired_error_two_layouts']:+.0%})", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--layouts", default="tp2,cp2,ep2")
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--keep", help="Keep the bundles in this directory.")
    ap.add_argument("--tp", action="store_true", help="Also check --what-if tp=1 from TP=2 bundles.")
    ap.add_argument("--reuse", action="store_true", help="Re-score the bundles already in --keep (run the missing).")
    ap.add_argument("--repeats", type=int, default=10, help="Un-profiled repetitions per run (TTFT samples).")
    ap.add_argument("--profiled-repeats", type=int, help="Profiled repetitions per run (default: the layout's).")
    a = ap.parse_args()
    global REUSE, REPEATS, PROFILED
    REUSE, REPEATS, PROFILED = a.reuse, a.repeats, a.profiled_repeats
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="commprobe-whatif-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = [r for lay in a.layouts.split(",") if lay for r in check(lay, a.rounds, work)]
    tp = check_tp(a.rounds, work) if a.tp else None
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"switch": rows, "tp": tp}, indent=1))
    print(f"bundles: {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
