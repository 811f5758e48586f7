"""Generate a large rank set with known truth: N ranks, a chosen straggler, known exposed time per
category, a chosen size on disk. Used by bench/scale.py and tests/test_scale.py.

    python bench/rankset.py OUT --ranks 32 --mb-per-rank 30 [--straggler 5] [--steps 50]

Each rank's trace has `steps` ProfilerStep windows of STEP_US; in each, a compute kernel
[0, C] on stream 7 and a TP allreduce kernel (NCCL, with its collective args and Seq) on stream
20 that every rank finishes at the same time: the straggler starts it D after the others (late
by D, so it overlaps nothing: D >= O), the others start at C - O and wait. Truth per step:

    straggler: exposed TP allreduce = A, transfer A, wait 0
    others:    exposed TP allreduce = D + A - O, transfer A, wait D

Padding to the chosen size: 1 µs compute kernels inside [0, C] (they change no union), with
launch events as Kineto writes them.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

STEP_US, C, O, D, A = 10_000.0, 6_000.0, 500.0, 800.0, 1_000.0
BASE_NS = 1_700_000_000_000_000_000


def truth(rank: int, straggler: int) -> dict:
    """Per step: exposed TP allreduce µs, and per call: wait µs."""
    return {"exposed_tp_us": A if rank == straggler else D + A - O, "wait_us": 0.0 if rank == straggler else D,
            "transfer_us": A}


def _step(k: int, rank: int, straggler: int, pad: int, corr0: int) -> list[str]:
    t0 = k * STEP_US
    start = t0 + C - O + (D if rank == straggler else 0.0)
    end = t0 + C - O + D + A
    ev = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "ts": t0, "dur": STEP_US - 1, "pid": 1,
           "tid": 1},
          {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "ts": t0, "dur": C, "pid": 0, "tid": 7},
          {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, "
           "ncclWork*)", "ts": start, "dur": end - start, "pid": 0, "tid": 20,
           "args": {"Collective name": "allreduce", "In msg nelems": 4096, "Out msg nelems": 4096, "dtype": "Float",
                    "Group size": 0, "Process Group Name": "0", "Process Group Description": "tp", "Seq": k}}]
    for j in range(pad):
        ts = t0 + (j * 7) % (C - 2)
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 1, "pid": 1, "tid": 1,
                   "args": {"External id": corr0 + j, "cbid": 211, "correlation": corr0 + j}})
        ev.append({"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4>", "ts": ts,
                   "dur": 1, "pid": 0, "tid": 7, "args": {"correlation": corr0 + j, "stream": 7}})
    return [json.dumps(e) for e in ev]


def generate(out: Path, ranks: int, mb_per_rank: float, straggler: int = 1, steps: int = 50,
             compress: bool = False) -> dict:
    """Write the set; returns its truth (per rank) and size."""
    out.mkdir(parents=True, exist_ok=True)
    per_pad = len(json.dumps(_step(0, 0, 1, 1, 0)[-1])) + len(json.dumps(_step(0, 0, 1, 1, 0)[-2])) + 2
    pad = max(0, int(mb_per_rank * 1e6 / steps / per_pad))
    total = 0
    for r in range(ranks):
        head = json.dumps({"schemaVersion": 1, "baseTimeNanoseconds": BASE_NS,
                           "distributedInfo": {"backend": "nccl", "rank": r, "world_size": ranks}})[:-1]
        name = out / (f"rank{r}.trace.json" + (".gz" if compress else ""))
        opener = gzip.open if compress else open
        with opener(name, "wt") as f:
            f.write(head + ', "traceEvents": [\n')
            for k in range(steps):
                lines = _step(k, r, straggler, pad, k * pad)
                f.write(",\n".join(lines) + (",\n" if k < steps - 1 else "\n"))
            f.write("]}\n")
        total += name.stat().st_size
    return {"ranks": ranks, "steps": steps, "straggler": straggler, "bytes": total,
            "truth": {r: truth(r, straggler) for r in range(ranks)}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--mb-per-rank", type=float, default=30.0)
    ap.add_argument("--straggler", type=int, default=1)
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    info = generate(Path(args.out), args.ranks, args.mb_per_rank, args.straggler, args.steps)
    print(json.dumps({k: v for k, v in info.items() if k != "truth"}))


if __name__ == "__main__":
    main()
