"""CUDA graph replays in a real CUPTI trace, for a session lent a GPU (bench/gpu_check.sh runs it
after gpu_check.py): a decode-like step (matmuls, an elementwise op) captured once in a CUDA graph
and replayed N times under torch.profiler, each replay in a `commprobe/decode[i]` span; then
`commprobe analyze` of the trace against a raw count of its events (graph launches, kernels,
their time). Writes $OUT/graph_trace.json.gz and $OUT/graph_check.json."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

ROOT = Path(__file__).resolve().parents[1]
REPLAYS = 20


def main() -> None:
    out = Path(os.environ.get("OUT", "gpu-check"))
    out.mkdir(parents=True, exist_ok=True)
    w = [torch.randn(1024, 1024, device="cuda") for _ in range(4)]
    x = torch.randn(8, 1024, device="cuda")
    static_out = torch.empty_like(x)

    def step():
        h = x
        for m in w:
            h = torch.relu(h @ m)
        static_out.copy_(h)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    torch.cuda.synchronize()
    trace = out / "graph_trace.json"
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(REPLAYS):
            with record_function(f"commprobe/decode[{i}]"):
                g.replay()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    with open(trace, "rb") as f, gzip.open(str(trace) + ".gz", "wb") as z:
        z.write(f.read())
    trace.unlink()
    ev = [e for e in json.load(gzip.open(str(trace) + ".gz"))["traceEvents"] if e.get("ph") == "X"]
    launches = [e for e in ev if e.get("cat") == "cuda_runtime" and "GraphLaunch" in e["name"]]
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    corr = {e.get("args", {}).get("correlation") for e in launches}
    truth = {"graph_launches": len(launches), "kernels": len(kernels), "kernel_us": sum(e["dur"] for e in kernels),
             "kernels_of_replays": sum(1 for e in kernels if e.get("args", {}).get("correlation") in corr)}
    r = subprocess.run([sys.executable, "-m", "commprobe.probe.cli", "analyze", str(trace) + ".gz", "--json"],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    res = json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr.strip()[-500:]}
    got = {"graphs": res.get("graphs"), "device_work": (res.get("ranks") or [{}])[0].get("device_work"),
           "phases": {ph: p["summary"] for ph, p in (res.get("phases") or {}).items()},
           "windows_from": (res.get("ranks") or [{}])[0].get("phase_rule")}
    doc = {"truth": truth, "analysis": got}
    (out / "graph_check.json").write_text(json.dumps(doc, indent=1))
    print("4. CUDA graph replays:", json.dumps(doc)[:1500])


if __name__ == "__main__":
    main()
