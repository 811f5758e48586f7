"""How noisy is this machine for the regression gate? Same code, separate runs, every pair gated.

Runs `commprobe profile` N times (separate processes, the same workload as .ci/run's gate)
and gates every consecutive pair (run i as baseline, run i+1 as current) at the thresholds
given, then prints per metric the median and the largest |change| across pairs and how many
pairs would have failed. This is how the thresholds of .ci/run were chosen.

    python bench/gate_noise.py --runs 11 --thresholds 10%/5pp,150%/30pp
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from commprobe.gate import Thresholds, gate  # noqa: E402

WORKLOAD = ["--preset", "tiny", "--tp", "2", "--steps", "16", "--repeats", "8", "--prompt-len", "32", "--backend", "dda"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--thresholds", default="10%/5pp,25%/10pp,150%/30pp",
                    help="comma-separated TIME%%/SHAREpp pairs to evaluate on the same runs")
    args = ap.parse_args()
    sets = [Thresholds(float(t.split("/")[0].rstrip("%")) / 100, float(t.split("/")[1].rstrip("p")) / 100)
            for t in args.thresholds.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="gate-noise-"))
    runs = []
    for i in range(args.runs):
        out = tmp / f"run{i}"
        r = subprocess.run([sys.executable, "-m", "commprobe.probe.cli", "profile", *WORKLOAD, "--out", str(out)], cwd=ROOT,
                           capture_output=True, text=True, env={**os.environ, "KINETO_LOG_LEVEL": "5"})
        if r.returncode:
            sys.exit(f"run {i} failed: {r.stderr.strip().splitlines()[-1]}")
        runs.append(out)
        print(f"run {i} done", file=sys.stderr)
    changes: dict[str, list[float]] = {}
    for th in sets:
        fails = 0
        for a, b in zip(runs, runs[1:]):
            res = gate(a, b, th=th)
            fails += res.exit_code != 0
            for v in res.metrics:
                if th is sets[0]:
                    changes.setdefault(v.name, []).append(v.change if v.change is not None else float("nan"))
        print(f"{len(runs) - 1} consecutive pairs, thresholds times +{th.max_regression:.0%}, shares "
              f"+{100 * th.max_share_increase:.0f} pp: {fails} failed")
    print()
    print("| metric | median change | largest slowdown | largest speed-up |")
    print("|---|---:|---:|---:|")
    for name, xs in sorted(changes.items()):
        xs = sorted(xs)
        fmt = (lambda x: f"{x:+.1%}") if "share" not in name else (lambda x: f"{100 * x:+.1f} pp")
        print(f"| `{name}` | {fmt(xs[len(xs) // 2])} | {fmt(xs[-1])} | {fmt(xs[0])} |")


if __name__ == "__main__":
    main()
