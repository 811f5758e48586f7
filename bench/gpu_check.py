"""One prepared GPU check, for a session that is lent a GPU (see bench/gpu_check.sh to run it).

1. the reference model on the GPU equals the CPU (tiny, fp32; TF32 off): prefill logits and
   greedy tokens;
2. `commprobe profile` of the single-GPU reference model (`small`, TP=1, NCCL, CUDA activity
   in the trace, NVML telemetry), then `commprobe analyze` and `commprobe report` of it;
3. with 2+ GPUs: DDA on symmetric memory against NCCL (allreduce, several sizes); with one GPU
   this part says why it is skipped.
Writes everything under $OUT (or ./gpu-check) and prints a summary line per part.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commprobe.probe.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "KINETO_LOG_LEVEL": "5", "PYTHONPATH": str(ROOT)})


def main() -> None:
    import torch

    out = Path(os.environ.get("OUT", "gpu-check"))
    out.mkdir(parents=True, exist_ok=True)
    summary = {"torch": torch.__version__, "cuda": torch.version.cuda, "hip": torch.version.hip,
               "gpus": torch.cuda.device_count(), "name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    print("devices:", summary)
    if not torch.cuda.is_available():
        sys.exit("gpu_check: torch sees no GPU")
    # 1. GPU equals CPU
    from commprobe.reference_impl.config import get_preset
    from commprobe.reference_impl.model import build_model, greedy_generate

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = get_preset("tiny")
    prompt = torch.randint(0, cfg.vocab_size, (2, 13), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        ref_l, ref_t = greedy_generate(build_model(cfg), prompt, 8)
        got_l, got_t = greedy_generate(build_model(cfg, device="cuda"), prompt.cuda(), 8)
    diff = (got_l.cpu() - ref_l).abs().max().item()
    summary["gpu_equals_cpu"] = {"max_abs_diff": diff, "tokens_equal": bool(torch.equal(got_t.cpu(), ref_t))}
    print("1. GPU vs CPU (tiny, fp32):", summary["gpu_equals_cpu"])
    # 2. profile + analyze + report
    run = out / "profile-small"
    r = cli("profile", "--preset", "small", "--tp", "1", "--device", "cuda", "--backend", "nccl", "--steps", "32",
            "--repeats", "3", "--out", str(run))
    (out / "profile.log").write_text(r.stdout + r.stderr)
    summary["profile_rc"] = r.returncode
    print("2. profile:", "ok" if r.returncode == 0 else r.stderr.strip().splitlines()[-1:])
    if r.returncode == 0:
        tel = [json.loads(x) for x in (run / "telemetry.jsonl").read_text().splitlines()]
        nv = [t for t in tel if t.get("source") == "nvidia"]
        summary["nvml_samples"] = len(nv)
        summary["nvml_first"] = nv[0] if nv else None
        a = cli("analyze", str(run), "--json")
        (out / "analysis.json").write_text(a.stdout)
        rep = cli("report", str(run), "-o", str(out / "report.html"))
        summary["analyze_rc"], summary["report_rc"] = a.returncode, rep.returncode
        if a.returncode == 0:
            res = json.loads(a.stdout)
            summary["timeline"] = res["ranks"][0]["timeline"]
            summary["verdicts"] = {ph: p["summary"] for ph, p in res["phases"].items()}
            summary["kernel_links"] = res.get("kernel_links")
            summary["device_work"] = res["ranks"][0].get("device_work")
            summary["graphs"] = res.get("graphs")
            summary["phase_rule"] = res["ranks"][0].get("phase_rule")
        summary["timings"] = json.loads((run / "timings.json").read_text())["ranks"][0]
        summary["timings"].pop("samples", None)
        print("   NVML samples:", summary["nvml_samples"], "| timeline:", summary.get("timeline"),
              "| verdicts:", summary.get("verdicts"))
        print("   kernels:", summary.get("device_work"), "| links:", summary.get("kernel_links"))
    # 3. DDA on symmetric memory
    if torch.cuda.device_count() < 2:
        summary["dda_symm"] = "skipped: one GPU (symmetric-memory DDA needs a process per GPU, 2 or more)"
    else:
        r = cli("bench", "collectives", "--backend", "nccl,dda", "--op", "allreduce", "--min", "4K", "--max", "64M",
                "--world", str(min(8, torch.cuda.device_count())), "--json")
        (out / "dda_symm.json").write_text(r.stdout)
        summary["dda_symm"] = "ok" if r.returncode == 0 else r.stderr.strip().splitlines()[-1:]
    print("3. DDA symmetric memory:", summary["dda_symm"])
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
