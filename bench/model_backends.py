"""TTIT of the reference model with each collective backend, interleaved A B A B in one run.

    python bench/model_backends.py [--backends gloo,dda] [--rounds 3] [--preset small] [--tp 2]

Each round runs every backend once (fresh ranks, same seed); the table shows medians over
rounds of each round's median TTIT, the decode-allreduce share (time blocked in TP
allreduces / decode time, mean over ranks), and the TTIT ratio against the first backend.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from commprobe.probe.launch import launch
from commprobe.probe.run import RunConfig, run_rank


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="gloo,dda")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=32)
    args = ap.parse_args()
    backends = args.backends.split(",")
    ttit: dict[str, list[float]] = {b: [] for b in backends}
    ttft: dict[str, list[float]] = {b: [] for b in backends}
    share: dict[str, list[float]] = {b: [] for b in backends}
    for rnd in range(args.rounds):
        for b in backends:
            cfg = RunConfig(preset=args.preset, tp=args.tp, decode_steps=args.steps, backends=[b])
            res = [r.timings[b] for r in launch(run_rank, args.tp, (cfg,), backend="gloo")]
            ttit[b].append(statistics.median(statistics.median(r.ttit_s) for r in res) * 1e3)
            ttft[b].append(statistics.median(statistics.median(r.ttft_s) for r in res) * 1e3)
            share[b].append(statistics.mean(r.decode_allreduce_share for r in res) * 100)
            print(f"round {rnd} {b}: TTIT {ttit[b][-1]:.2f} ms, decode allreduce {share[b][-1]:.1f}%", file=sys.stderr)
    base = statistics.median(ttit[backends[0]])
    print(f"| backend | TTIT median ms | TTFT median ms | decode allreduce share | TTIT vs {backends[0]} |")
    print("|---|---|---|---|---|")
    for b in backends:
        m = statistics.median(ttit[b])
        print(f"| {b} | {m:.2f} | {statistics.median(ttft[b]):.1f} | {statistics.median(share[b]):.1f}% | {base / m:.2f}x faster |"
              if b != backends[0] else f"| {b} | {m:.2f} | {statistics.median(ttft[b]):.1f} | {statistics.median(share[b]):.1f}% | 1.00x |")


if __name__ == "__main__":
    main()
