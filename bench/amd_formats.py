"""AMD's RPD and rocprofv3 JSON readers against the same content written as Kineto JSON.

    python bench/amd_formats.py [--rounds 7] [--scale 10]

For each real file in tests/data/traces/amd/ (the rocprofv3 JSON also repeated --scale times
along its timeline, for a size where reading dominates): the file is read once with commprobe's
reader, and the Trace it gives is written back as a Kineto JSON of the same events (names,
times, categories, correlation ids). Then, A B A B ... (`--rounds` each), the reader alone in
this process (events per second, median) and a whole `commprobe analyze` process (median
seconds, peak RSS). Temporary files are removed at the end.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.hostile import run  # noqa: E402
from commprobe.analyzers.readers.model import DEVICE_CATS  # noqa: E402
from commprobe.analyzers.readers.sources import traces_in  # noqa: E402

AMD = ROOT / "tests" / "data" / "traces" / "amd"


def as_kineto(src: Path, out: Path) -> int:
    """The events commprobe reads from `src`, as a Kineto JSON; returns the event count."""
    (t,) = list(traces_in(src))
    events = []
    for i in range(len(t.ts)):
        cat = t.cats[t.cat_id[i]]
        ev = {"ph": "X", "cat": cat, "name": t.names[t.name_id[i]], "ts": round(float(t.ts[i]), 3),
              "dur": round(float(t.dur[i]), 3), "pid": 0 if cat in DEVICE_CATS else 1, "tid": int(t.tid_id[i])}
        if t.arg_corr[i] >= 0:
            ev["args"] = {"correlation": int(t.arg_corr[i])}
        events.append(ev)
    out.write_text(json.dumps({"baseTimeNanoseconds": t.origin_ns, "traceEvents": events}))
    return len(events)


def scaled_rocprof(src: Path, out: Path, times: int) -> None:
    """The rocprofv3 JSON with its records repeated `times` times, each copy after the last."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    for p in doc["rocprofiler-sdk-tool"]:
        br = p["buffer_records"]
        recs = br["kernel_dispatch"]
        span = max(r["end_timestamp"] for r in recs) - min(r["start_timestamp"] for r in recs) + 1
        copies = []
        for k in range(times):
            for r in recs:
                c = dict(r)
                c["start_timestamp"] += k * span
                c["end_timestamp"] += k * span
                copies.append(c)
        br["kernel_dispatch"] = copies
    out.write_text(json.dumps(doc))


def read_time(path: Path) -> float:
    t = time.perf_counter()
    for _ in traces_in(path):
        pass
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--scale", type=int, default=10)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="commprobe-amd-"))
    try:
        big = tmp / f"x{a.scale}_results.json"
        scaled_rocprof(AMD / "rocprofv3_mi350_pid908_results.json.gz", big, a.scale)
        inputs = {"rpd (gzip)": AMD / "rpd_vllm_mi300_mytrace.rpd.gz",
                  "rocprofv3 json (gzip)": AMD / "rocprofv3_mi350_pid908_results.json.gz",
                  f"rocprofv3 json x{a.scale}": big}
        print("| input | MB | events | reader Mev/s | same as Kineto JSON Mev/s | reader / JSON time | "
              "analyze s | JSON analyze s | peak RSS MB | JSON peak RSS MB |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name, path in inputs.items():
            js = tmp / (path.name + ".kineto.json")
            n = as_kineto(path, js)
            rt: dict[str, list[float]] = {"a": [], "b": []}
            pt: dict[str, list[float]] = {"a": [], "b": []}
            rss = {"a": 0, "b": 0}
            for _ in range(a.rounds):
                for k, p in (("a", path), ("b", js)):
                    rt[k].append(read_time(p))
                    dt, peak, rc, line = run(p)
                    if rc:
                        raise SystemExit(f"{p}: exit {rc}: {line}")
                    pt[k].append(dt)
                    rss[k] = max(rss[k], peak)
            ra, rb = statistics.median(rt["a"]), statistics.median(rt["b"])
            print(f"| {name} | {path.stat().st_size / 1e6:.1f} | {n:,} | {n / ra / 1e6:.2f} | {n / rb / 1e6:.2f} | "
                  f"{ra / rb:.2f} | {statistics.median(pt['a']):.2f} | {statistics.median(pt['b']):.2f} | "
                  f"{rss['a'] / 1e6:.0f} | {rss['b'] / 1e6:.0f} |", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
