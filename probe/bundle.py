"""Writing the run bundle: the facts of this run (torch, device, layout) in a manifest.

The layout, the atomic writer and every reader live in common/bundle.py; this module adds
what only a process with torch can know.
"""

from __future__ import annotations

import os
import platform
import sys

from commprobe.common.bundle import CLOCK, MANIFEST, SCHEMA, TELEMETRY, TIMINGS, now_iso, trace_name, write_json
from commprobe.common.host import cpu_model, host_name, usable_cores

__all__ = ["MANIFEST", "SCHEMA", "TIMINGS", "device_facts", "manifest", "now_iso", "write_json"]


def device_facts() -> dict:
    import torch

    facts = {"kind": "cpu", "cpu_count": os.cpu_count(), "usable_cores": usable_cores(), "machine": platform.machine(),
             "processor": cpu_model()}
    if torch.cuda.is_available():
        facts.update(kind="rocm" if torch.version.hip else "cuda", name=torch.cuda.get_device_name(0),
                     count=torch.cuda.device_count(),
                     runtime=torch.version.hip or torch.version.cuda, driver=_nvidia_driver())
    return facts


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
        "host": host_name(),
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
        "traces": [trace_name(r) for r in range(world)],
        "timings": TIMINGS,
        "telemetry": TELEMETRY,
    }
