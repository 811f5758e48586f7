"""Cross-check and race commprobe's analyzers against HolisticTraceAnalysis (HTA).

    python -m venv /tmp/hta && /tmp/hta/bin/pip install holistictraceanalysis msgspec
    /tmp/hta/bin/python bench/analyzer_vs_hta.py [--shared tests/data/traces/hta] [--generate-mb 520]

HTA is used here only, never as a dependency. For each shared trace: HTA's comm/compute
overlap (get_comm_comp_overlap) beside ours (whole trace, and per ProfilerStep: HTA analyzes
one iteration by default), and the time of HTA (parse + overlap) against commprobe's whole
`analyze` (load, classify, overlap, verdict), imports excluded for both, each in a fresh
process so peak memory (ru_maxrss) is per tool; the time is the median of --repeats runs in that
process (one for the generated set). Then the same race on a generated 8-rank set.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HWM = """
def hwm():  # peak RSS of this process image (VmHWM resets at exec, unlike ru_maxrss)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0
"""

OURS = HWM.replace("{", "{{").replace("}", "}}") + """
import sys, time, json
sys.path.insert(0, {root!r})  # a checkout; commprobe.* must be installed (pip install --no-deps -e .)
t = time.perf_counter()
from commprobe.analyzers.analysis import analyze
from commprobe.analyzers.per_rank.attribution import comm_comp_overlap, step_windows
from commprobe.analyzers.per_rank.classify import classify
from commprobe.analyzers.per_rank.links import link_kernels_to_host_ops
from commprobe.analyzers.readers.files import load_traces
times = []
for _ in range(int(sys.argv[2])):  # median of repeats: single small runs are noise on this machine
    t = time.perf_counter()
    r = analyze(sys.argv[1])
    times.append(time.perf_counter() - t)
dt = sorted(times)[len(times) // 2]
peak = hwm()  # analyze alone; the cross-check below loads every rank at once
ov, steps = {{}}, {{}}
for tr in load_traces(sys.argv[1]):
    cls = classify(tr)
    link_kernels_to_host_ops(tr, cls)
    ov[tr.rank] = comm_comp_overlap(tr, cls)["overlap_pct"]
    steps[tr.rank] = {{k: round(comm_comp_overlap(tr, cls, w)["overlap_pct"], 2) for k, w in step_windows(tr).items()}}
print(json.dumps({{"s": dt, "rss": peak, "bytes": r["source"]["uncompressed_bytes"], "overlap": ov, "steps": steps}}))
"""

HTA = HWM.replace("{", "{{").replace("}", "}}") + """
import sys, time, json, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
times = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    a = TraceAnalysis(trace_dir=sys.argv[1])
    df = a.get_comm_comp_overlap(visualize=False)
    times.append(time.perf_counter() - t)
dt = sorted(times)[len(times) // 2]
ov = {{int(r["rank"]): float(r["comp_comm_overlap_pctg"]) for _, r in df.iterrows()}}
print(json.dumps({{"s": dt, "rss": hwm(), "overlap": ov}}))
"""


def run(code: str, path: Path, repeats: int = 1) -> dict:
    r = subprocess.run([sys.executable, "-c", code.format(root=str(ROOT)), str(path), str(repeats)],
                       capture_output=True, text=True)
    if r.returncode:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1][:160]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def generate(out: Path, ranks: int, mb_per_rank: float, seed: int = 0) -> None:
    """Kineto-like GPU traces: cpu_ops, their cudaLaunchKernel runtime events and the kernels they
    launch (matched by correlation id, as HTA requires: it drops kernels without a launch), compute
    on stream 7, NCCL allreduce on stream 20 overlapping part of the compute, ProfilerStep windows."""
    rnd = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        ev, t, step, corr = [], 0.0, 0, 0
        approx = 0
        while approx < mb_per_rank * 1e6:
            ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                       "ts": t, "dur": 5000.0})
            ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{step}", "pid": 0, "tid": 7,
                       "ts": t, "dur": 5000.0, "args": {}})
            k = t
            for i in range(50):
                d = rnd.uniform(20, 80)
                corr += 1
                ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": k, "dur": 5.0,
                           "args": {"External id": corr, "Ev Idx": i}})
                ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": k + 1, "dur": 3.0, "args": {"External id": corr, "correlation": corr}})
                ev.append({"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0, "tid": 7,
                           "ts": k + 3, "dur": d, "args": {"device": 0, "stream": 7, "correlation": corr,
                                                            "External id": corr, "grid": [108, 1, 1], "block": [256, 1, 1]}})
                k += d + rnd.uniform(1, 20)
                if i % 10 == 0:
                    corr += 1
                    ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                               "ts": k - d / 2 - 4, "dur": 3.0, "args": {"External id": corr, "correlation": corr}})
                    ev.append({"ph": "X", "cat": "kernel", "pid": 0, "tid": 20, "ts": k - d / 2, "dur": rnd.uniform(30, 90),
                               "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                               "args": {"device": 0, "stream": 20, "correlation": corr, "External id": corr,
                                        "Collective name": "allreduce",
                                        "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20, "dtype": "BFloat16",
                                        "Group size": ranks, "Process Group Name": "0",
                                        "Process Group Description": "default_pg"}})
            t += 5000.0
            step += 1
            approx += 50 * 3 * 200 + 5 * 2 * 330 + 500
        doc = {"schemaVersion": 1, "baseTimeNanoseconds": 1_700_000_000_000_000_000,
               "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": ranks}, "traceEvents": ev}
        (out / f"rank{rank}.json").write_text(json.dumps(doc))


def single_dir(f: Path, tmp: Path) -> Path:
    d = tmp / f.name.replace(".", "_")
    d.mkdir()
    (d / f.name).symlink_to(f.resolve())
    return d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=str(ROOT / "tests" / "data" / "traces" / "hta"))
    ap.add_argument("--generate-mb", type=float, default=580.0, help="total uncompressed MB of the 8-rank set (0: skip)")
    ap.add_argument("--repeats", type=int, default=7, help="runs per tool and shared trace, in one process (median)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cp-vs-hta-"))
    try:
        print("| trace | MB (uncompressed) | HTA overlap % | commprobe overlap % | HTA s | commprobe s | speed-up | "
              "commprobe MB/s | HTA peak RSS MB | commprobe peak RSS MB |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        cases = [(f.name, single_dir(f, tmp)) for f in sorted(Path(args.shared).glob("*.json.gz"))]
        if args.generate_mb > 0:
            gen = tmp / "generated-8-ranks"
            generate(gen, 8, args.generate_mb / 8)
            cases.append(("generated 8 ranks", gen))
        for label, d in cases:
            k = 1 if label.startswith("generated") else args.repeats
            ours, hta = run(OURS, d, k), run(HTA, d, k)
            mb = ours.get("bytes", 0) / 1e6
            def fmt_ov(x):
                if "overlap" not in x:
                    return x.get("error", "?")
                items = sorted(x["overlap"].items(), key=lambda kv: int(kv[0]))
                return ", ".join(f"r{k}: {v:.1f}" for k, v in items)[:80]
            hs, cs = hta.get("s"), ours.get("s")
            print(f"| {label} | {mb:.1f} | {fmt_ov(hta)} | {fmt_ov(ours)} | {hs and f'{hs:.2f}'} | {cs and f'{cs:.3f}'} | "
                  f"{(hs / cs) if hs and cs else float('nan'):.1f}x | {mb / cs if cs else float('nan'):.0f} | "
                  f"{hta.get('rss', 0) / 1e6:.0f} | {ours.get('rss', 0) / 1e6:.0f} |", flush=True)
            if ours.get("steps"):
                print(f"|  per ProfilerStep, commprobe: {json.dumps(ours['steps'])[:150]} |||||||||", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
