"""Does DDA's adaptive wait recover after a hiccup? Two ranks run a decode-like loop: a little
compute whose length jitters per rank and call, then a small allreduce. From call --hiccup one rank
stalls --stall-us before each of --stalls calls (page faults, preempted slices, a GC pause). Per wait mode:
the median time per call before and after the hiccup, and the longest streak of calls over 100 µs
after it. Modes alternate launch by launch (A B A B ...); medians over --launches.

A rank whose adaptive spin budget has fallen to its floor sleeps in every wait; its peer, woken
late, arrives late to the next call, so its own spin fails too: both can stay asleep (a vCPU woken
from idle costs 100 µs or more here), the trap this measures.

    python bench/dda_trap.py [--modes adaptive,spin-futex] [--launches 5] [--calls 3000] [--ref COMMIT]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _rank(mode: str, calls: int, hiccup: int, stall_us: float, stalls: int, seed: int, src: str | None) -> list[float]:
    import random

    import torch
    import torch.distributed as dist

    from commprobe.collectives import dda as dda_mod
    from commprobe.collectives.dda import DDAComm

    if src:  # another version of the kernels (--ref): compiled and cached apart by its source's hash
        dda_mod._SRC = Path(src)

    rank = dist.get_rank()
    rng = random.Random(seed * 10 + rank)
    dda = DDAComm("tp", wait=mode)
    a = torch.randn(64, 64)
    x = torch.ones(64)
    out = []
    for i in range(calls):
        for _ in range(rng.randint(2, 6)):  # ~10-60 µs of compute, jittering per rank and call
            a = torch.tanh(a @ a)
        if hiccup <= i < hiccup + stalls and rank == 1:
            time.sleep(stall_us * 1e-6)
        t = time.perf_counter()
        dda.all_reduce(x)
        out.append((time.perf_counter() - t) * 1e6)
    dda.close()
    return out


def main() -> None:
    from commprobe.probe.launch import launch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="adaptive,spin-futex")
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--hiccup", type=int, default=300)
    ap.add_argument("--stall-us", type=float, default=3000)
    ap.add_argument("--stalls", type=int, default=30, help="consecutive calls the rank stalls before")
    ap.add_argument("--load", type=int, default=0, help="processes spinning beside the ranks (a contended host)")
    ap.add_argument("--ref", help="a commit: its dda_cpu.c runs as MODE@ref beside this checkout's")
    a = ap.parse_args()
    modes = a.modes.split(",")
    src = None
    if a.ref:
        import tempfile

        src = Path(tempfile.mkdtemp(prefix="dda-ref-")) / "dda_cpu.c"
        src.write_bytes(subprocess.run(["git", "show", f"{a.ref}:collectives/dda_cpu.c"], check=True,
                                       capture_output=True, cwd=Path(__file__).resolve().parents[1]).stdout)
        modes += [f"{m}@ref" for m in modes]
    res: dict[str, list[tuple[float, float, int]]] = {m: [] for m in modes}
    for i in range(a.launches):
        for m in modes:
            mode, _, ref = m.partition("@")
            spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.load)]
            try:
                    per_rank = launch(_rank, 2, (mode, a.calls, a.hiccup, a.stall_us, a.stalls, i, str(src) if ref else None),
                                  timeout=300)
            finally:
                for x in spin:
                    x.kill()
                    x.wait()
            before = [x for r in per_rank for x in r[50:a.hiccup]]
            after = [x for r in per_rank for x in r[a.hiccup + a.stalls:]]
            streak = 0
            for r in per_rank:
                cur = 0
                for x in r[a.hiccup + a.stalls:]:
                    cur = cur + 1 if x > 100 else 0
                    streak = max(streak, cur)
            res[m].append((statistics.median(before), statistics.median(after), statistics.fmean(after), streak))
            print(f"{m:14s} launch {i}: median {res[m][-1][0]:6.1f} µs before, {res[m][-1][1]:6.1f} after "
                  f"(mean {res[m][-1][2]:6.1f}); longest streak over 100 µs after: {streak}", flush=True)
    print("\n| mode | median before (µs) | median after (µs) | mean after (µs) | longest slow streak after (calls) |"
          "\n|---|---|---|---|---|")
    for m in modes:
        b, af, mean, s = zip(*res[m])
        print(f"| {m} | {statistics.median(b):.1f} ({min(b):.1f}–{max(b):.1f}) | {statistics.median(af):.1f} "
              f"({min(af):.1f}–{max(af):.1f}) | {statistics.median(mean):.1f} ({min(mean):.1f}–{max(mean):.1f}) | "
              f"{statistics.median(s):.0f} ({min(s)}–{max(s)}) |")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
