"""An Nsight Systems export against an equally sized Kineto trace: whole `commprobe analyze`
processes, A B A B ..., medians (the issue's goal: the export in at most 2x the JSON's time).

    python bench/sqlite_vs_json.py [--mb 1000] [--rounds 3]

Both files hold the same kind of step (a GEMM, an NCCL allreduce and all-to-all with their
launches and NVTX ranges, a copy), repeated until the file reaches --mb; the export uses the
table definitions of the real export in tests/data/traces/hpcgroup-pipit. Written to a temporary
directory, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.hostile import run  # noqa: E402
from tests.test_nsys import AR, CLOVER, ORIGIN, SAXPY, SR, TABLES, _sql  # noqa: E402

STEP_NS = 1_000_000
KERNELS = (("gemm_bf16_kernel", None), (AR, "ncclAllReduce"), (SR, "ncclAllToAll"))


def write_json(path: Path, mb: float) -> int:
    with open(path, "w") as f:
        f.write('{"baseTimeNanoseconds": %d, "traceEvents": [\n' % ORIGIN)
        step, corr, first = 0, 0, True
        while f.tell() < mb * 1e6:
            b = step * STEP_NS
            rows = []
            for j, (k, host) in enumerate(KERNELS):
                corr += 1
                hs = b + 10_000 + j * 300_000
                if host:
                    rows.append({"ph": "X", "cat": "user_annotation", "name": host, "ts": (hs - 2000) / 1e3, "dur": 9.0,
                                 "pid": 0, "tid": 1})
                rows.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": hs / 1e3, "dur": 5.0,
                             "pid": 0, "tid": 1, "args": {"correlation": corr}})
                rows.append({"ph": "X", "cat": "kernel", "name": k, "ts": (hs + 10_000) / 1e3, "dur": 250.0, "pid": 0,
                             "tid": 7, "args": {"correlation": corr, "stream": 7, "device": 0}})
            text = ",\n".join(json.dumps(r) for r in rows)
            f.write(text if first else ",\n" + text)
            first = False
            step += 1
        f.write("]}\n")
    return path.stat().st_size


def write_export(path: Path, mb: float) -> int:
    db = sqlite3.connect(path)
    for src, tables in TABLES.items():
        for name in tables:
            db.execute(_sql(src, "SELECT sql FROM sqlite_master WHERE name = ?", name)[0][0])
    db.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.13.2')")
    db.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (ORIGIN,))
    names = ["gemm_bf16_kernel", AR, SR, "cudaLaunchKernel"]
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", list(enumerate(names, 1)))
    gpid, gtid = (1 << 56) | (4000 << 24), (1 << 56) | (4000 << 24) | 4005
    given = ["start", "end", "deviceId", "contextId", "streamId", "correlationId", "globalPid", "demangledName",
             "shortName", "gridId"]
    rest = [r[1] for r in db.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)") if r[3] and r[1] not in given]
    kcols, zeros = given + rest, (0,) * len(rest)  # the other NOT NULL columns (grid, block, registers, ...): 0
    step, corr = 0, 0
    while True:
        kern, rt, nvtx = [], [], []
        for _ in range(2000):
            b = step * STEP_NS
            for j, (k, host) in enumerate(KERNELS):
                corr += 1
                hs = b + 10_000 + j * 300_000
                if host:
                    nvtx.append((hs - 2000, hs + 7000, 59, host, gtid))
                rt.append((hs, hs + 5000, 0, gtid, corr, 4, 0))
                kern.append((hs + 10_000, hs + 260_000, 0, 1, 7, corr, gpid, j + 1, j + 1, corr))
            step += 1
        db.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL ({', '.join(kcols)}) "
                       f"VALUES ({', '.join('?' * len(kcols))})", [r + zeros for r in kern])
        db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, nameId, "
                       "returnValue) VALUES (?, ?, ?, ?, ?, ?, ?)", rt)
        db.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, ?, ?, ?)", nvtx)
        db.commit()
        if path.stat().st_size >= mb * 1e6:
            break
    db.close()
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not CLOVER.exists() or not SAXPY.exists():
        raise SystemExit("needs tests/data/traces/hpcgroup-pipit (the export's table definitions)")
    tmp = Path(tempfile.mkdtemp(prefix="commprobe-sqlite-"))
    try:
        t = time.perf_counter()
        js, sq = tmp / "trace.json", tmp / "trace.sqlite"
        sizes = {"kineto json": write_json(js, args.mb), "nsys sqlite": write_export(sq, args.mb)}
        print(f"generated in {time.perf_counter() - t:.0f} s: " + ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in sizes.items()),
              flush=True)
        times: dict[str, list[float]] = {"kineto json": [], "nsys sqlite": []}
        rss: dict[str, int] = {}
        for _ in range(args.rounds):
            for name, path in (("kineto json", js), ("nsys sqlite", sq)):
                dt, peak, rc, line = run(path)
                if rc:
                    raise SystemExit(f"{name}: exit {rc}: {line}")
                times[name].append(dt)
                rss[name] = max(rss.get(name, 0), peak)
        print("| input | MB | median s | MB/s | peak RSS MB |\n|---|---|---|---|---|")
        for name, ts in times.items():
            m = statistics.median(ts)
            print(f"| {name} | {sizes[name] / 1e6:.0f} | {m:.2f} | {sizes[name] / 1e6 / m:.0f} | {rss[name] / 1e6:.0f} |")
        ratio = statistics.median(times["nsys sqlite"]) / statistics.median(times["kineto json"])
        per_mb = ratio * sizes["kineto json"] / sizes["nsys sqlite"]
        print(f"export / json time: {ratio:.2f}x (per MB: {per_mb:.2f}x)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
