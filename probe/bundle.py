"""The run bundle: what `commprobe profile` leaves on disk for the analyzers.

    OUT/manifest.json       versions, host, device, world layout, model, backend, sizes, status
    OUT/rank{r}.trace.json.gz   one Kineto trace per rank (phase and collective spans)
    OUT/timings.json        un-profiled TTFT/TTIT (and profiled, for the overhead ratio)
    OUT/telemetry.jsonl     host (and GPU) samples on the traces' clock

With several backends, OUT holds one sub-bundle per backend (OUT/gloo/, OUT/dda/), each a
complete bundle, plus the shared telemetry and a top manifest listing them. Every write is
atomic (temporary file, then rename) so a crash never leaves half a JSON file.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path

SCHEMA = "commprobe.bundle/1"
CLOCK = ("trace event time in Unix ns = ts_us * 1000 + baseTimeNanoseconds; "
         "telemetry t_ns = Unix ns (time.time_ns)")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def write_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def device_facts() -> dict:
    import torch

    from collectives.dda import usable_cores

    facts = {"kind": "cpu", "cpu_count": os.cpu_count(), "usable_cores": usable_cores(), "machine": platform.machine(),
             "processor": _cpu_model()}
    if torch.cuda.is_available():
        facts.update(kind="rocm" if torch.version.hip else "cuda", name=torch.cuda.get_device_name(0),
                     count=torch.cuda.device_count(),
                     runtime=torch.version.hip or torch.version.cuda, driver=_nvidia_driver())
    return facts


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _nvidia_driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
        return v.decode() if isinstance(v, bytes) else v
    except Exception:
        return None


def world_layout(cfg) -> list[dict]:
    """rank -> its index and group on each axis (TP innermost; see collectives.mesh)."""
    return [{"rank": row["rank"], "tp_rank": row["tp"], "tp_group": row["tp_group"], "cp_rank": row["cp"],
             "cp_group": row["cp_group"], "ep_rank": row["ep"], "ep_group": row["ep_group"]}
            for row in cfg.mesh.layout()]


def manifest(cfg, model_cfg: dict, backend: str | list[str], world: int) -> dict:
    import torch

    from . import __version__

    return {
        "schema": SCHEMA,
        "commprobe_version": __version__,
        "torch_version": torch.__version__,
        "python": sys.version.split()[0],
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "device": device_facts(),
        "world": {"size": world, "tp": cfg.tp, "cp": cfg.cp, "ep": cfg.ep, "layout": world_layout(cfg),
                  "cp_variant": cfg.cp_variant if cfg.cp > 1 else None},
        "model": model_cfg,
        "backend": backend,
        "run": {"batch": cfg.batch, "prompt_len": cfg.prompt_len, "decode_steps": cfg.decode_steps,
                "device": getattr(cfg, "device", "auto"),
                "repeats": cfg.repeats, "seed": cfg.seed, "checkpoint": cfg.checkpoint},
        "clock": CLOCK,
        "started_at": now_iso(),
        "finished_at": None,
        "status": "running",
        "error": None,
        "traces": [f"rank{r}.trace.json.gz" for r in range(world)],
        "timings": "timings.json",
        "telemetry": "telemetry.jsonl",
    }
