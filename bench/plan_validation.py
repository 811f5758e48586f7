"""Validate the cost model on this machine: calibrate on TP=2 only, predict other layouts.

1. sweep 2-rank allreduces (gloo, dda); `bench time-sharing` (a 4 KiB DDA allreduce after
   each piece of weight-streaming work, 256 KiB to 64 MiB, 2 ranks against 4 on this 2-core
   machine, alternated in one launch, three launches: what ranks beyond the cores cost per
   call; a benchmark, not a run of the reference model); profile the reference model at TP=2 (the
   `small` and `tiny` presets: weight-bound and overhead-bound decode; `moe-small`: experts,
   and the router's token counts per expert, which give the EP runs' busiest-rank skew);
2. `plan calibrate` on those alone;
3. profile TP=4, CP=2 and EP=2 (moe-small) runs and compare their measured TTFT and TTIT
   (median over samples of the slowest rank, un-profiled) with the model's predictions.
Every round profiles all runs one after the other (`--rounds`, default 3), so that the
machine's slow and fast spells fall on calibration and validation alike; each run's
numbers are medians over rounds.

    python bench/plan_validation.py [--backend dda] [--repeats 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from dataclasses import replace  # noqa: E402

from commprobe.plan.calibrate import calibrate, expert_imbalance, options_of, read_run, routed_histogram, workload_of  # noqa: E402
from commprobe.plan.costmodel import predict  # noqa: E402
from commprobe.plan.hardware import to_toml  # noqa: E402

CALIB = [("small", {"tp": 2}), ("tiny", {"tp": 2}), ("moe-small", {"tp": 2})]
VALIDATE = [("small", {"tp": 4}), ("small", {"tp": 1, "cp": 2}), ("moe-small", {"tp": 1, "ep": 2}),
            ("small", {"tp": 2, "cp": 2})]


def cli(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "commprobe.probe.cli", *args], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "KINETO_LOG_LEVEL": "5"})
    if r.returncode:
        sys.exit(f"commprobe {' '.join(args)} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return r.stdout


def run_name(preset: str, layout: dict) -> str:
    return preset + "-" + "-".join(f"{k}{v}" for k, v in layout.items())


def profile(tmp: Path, preset: str, layout: dict, args) -> Path:
    name = run_name(preset, layout)
    out = tmp / name
    flags = [x for k, v in layout.items() for x in (f"--{k}", str(v))]
    cli("profile", "--preset", preset, *flags, "--backend", args.backend, "--prompt-len", str(args.prompt_len),
        "--steps", str(args.steps), "--repeats", str(args.repeats), "--out", str(out), "--oversubscribe")
    print(f"profiled {tmp.name}/{name}", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="dda")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every profile, interleaved; medians over rounds")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="plan-validate-"))
    sweep = tmp / "sweep.json"
    sweep.write_text(cli("bench", "collectives", "--op", "allreduce", "--backend", "gloo,dda", "--min", "1K",
                         "--max", "4M", "--world", "2", "--json"))
    shared = tmp / "time-sharing.json"
    # Three launches: how the scheduler places 4 ranks on 2 cores differs from launch to launch
    # (the extra per call moved 0.1-1.2 ms between launches of the same code); calibrate
    # takes the median per work size.
    shared.write_text(json.dumps([row for _ in range(3) for row in json.loads(
        cli("bench", "time-sharing", "--world", "4", "--rounds", "7", "--json"))]))
    # Every round profiles the calibration and the validation runs one after the other, so that
    # the machine's slow and fast spells fall on both; each run's numbers are medians over rounds.
    bundles: dict[str, list[Path]] = {}  # run name -> its bundle in each round
    for i in range(args.rounds):
        for p, lay in CALIB + VALIDATE:
            bundles.setdefault(run_name(p, lay), []).append(profile(tmp / f"round{i}", p, lay, args))
    calib = [b for p, lay in CALIB for b in bundles[run_name(p, lay)]]
    hw, _ = calibrate([str(sweep), str(shared), *map(str, calib)])
    (tmp / "calibrated.toml").write_text(to_toml(hw))  # what plan/hardware/cpu-2core.toml is made from
    routed = {p: routed_histogram(bundles[run_name(p, lay)][0]) for p, lay in CALIB}
    print(f"calibrated: {hw.peak_tflops * 1e3:.2f} GFLOP/s, {hw.mem_bw_GBps:.2f} GB/s, "
          f"{hw.layer_overhead_us:.0f} µs/layer; " + ", ".join(
              f"{k}: {v.alpha_us:.1f} µs + {v.bw_GBps:.2f} GB/s" for k, v in hw.links.items()))
    print("time-sharing, extra µs per call at interval µs: " + ", ".join(
        f"{y:.0f} at {x:.0f}" for x, y in hw.time_sharing))
    print(f"\n| run | measured TTFT ms | predicted | error | measured TTIT ms | predicted | error |  ({args.rounds} rounds)")
    print("|---|---:|---:|---:|---:|---:|---:|")
    out = []
    for p, lay in CALIB + VALIDATE:
        runs = [read_run(b) for b in bundles[run_name(p, lay)]]
        run = runs[0]
        ttft = statistics.median(r["ttft_ms"] for r in runs)
        ttit = statistics.median(r["ttit_ms"] for r in runs)
        opt = options_of(run)
        hist = routed.get(p)
        if run["layout"].ep > 1 and hist is not None:  # skew from the TP=2 run, never from the run predicted
            opt = replace(opt, expert_imbalance=expert_imbalance(hist, run["layout"].ep))
            print(f"{run_name(p, lay)}: expert imbalance {opt.expert_imbalance:.3f} (from {p} TP=2's routing)",
                  file=sys.stderr)
        pred = predict(workload_of(run), run["layout"], hw, opt)
        e1, e2 = pred.ttft_ms / ttft - 1, pred.ttit_ms / ttit - 1
        tag = " (calibration)" if (p, lay) in CALIB else ""
        print(f"| {run_name(p, lay)}{tag} | {ttft:.1f} | {pred.ttft_ms:.1f} | {e1:+.0%} | {ttit:.2f} | "
              f"{pred.ttit_ms:.2f} | {e2:+.0%} |")
        out.append({"run": run_name(p, lay), "ttft_ms": [r["ttft_ms"] for r in runs],
                    "ttit_ms": [r["ttit_ms"] for r in runs], "ttft_error": e1, "ttit_error": e2})
    (tmp / "errors.json").write_text(json.dumps(out, indent=1))
    print(f"\nbundles and errors.json in {tmp}", file=sys.stderr)


if __name__ == "__main__":
    main()
