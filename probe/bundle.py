"""The one writer of the run bundle: manifests (started "running", finished with the status),
timings, and the names of the trace and telemetry files they list.

The layout, the atomic writer and every reader live in common/bundle.py; this module adds
what only a process with torch can know (torch, device, layout) and writes it there.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
from pathlib import Path

from commprobe.common.bundle import (
    CLOCK,
    FLIGHT_RECORDER,
    MANIFEST,
    SCHEMA,
    TELEMETRY,
    TIMINGS,
    host_telemetry_name,
    now_iso,
    trace_name,
    write_json,
)
from commprobe.common.host import cpu_model, host_name, usable_cores

__all__ = ["FLIGHT_RECORDER", "MANIFEST", "SCHEMA", "TELEMETRY", "TIMINGS", "device_facts", "finish_manifests", "host_telemetry_name",
           "manifest", "now_iso", "start_manifests", "write_json", "write_timings"]


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
        "fault": _fault(),
    }


def _fault() -> dict | None:
    """The performance fault injected into this run (probe/faults.py), the truth a diagnosis is
    scored against; None for a run without one."""
    from .faults import perf_fault

    f = perf_fault()
    return f.to_dict() if f else None


def timings_doc(results: list, backend: str) -> dict:
    """timings.json of one backend: each rank's un-profiled (and profiled) TTFT/TTIT samples,
    which the gate reads as metrics and `profile` prints; the profiled/un-profiled TTIT ratio is
    the profiler's overhead."""
    ranks = []
    for r in results:
        t, p = r.timings[backend], r.profiled.get(backend)
        row = {**t.summary(), "samples": {"ttft_s": t.ttft_s, "ttit_s": t.ttit_s,
                                          "decode_allreduce_s": t.decode_allreduce_s,
                                          "prefill_comm_s": t.prefill_comm_s, "decode_comm_s": t.decode_comm_s}}
        if t.routed_tokens:
            row["routed_tokens"] = t.routed_tokens
        if p is not None and p.ttit_s:
            row["profiled"] = {**p.summary(), "samples": {"ttft_s": p.ttft_s, "ttit_s": p.ttit_s}}
        ranks.append(row)
    doc = {"schema": SCHEMA, "backend": backend, "ranks": ranks}
    prof = [row["profiled"]["ttit_median_ms"] for row in ranks if "profiled" in row]
    if prof:
        doc["profiler_overhead_ttit"] = statistics.median(prof) / statistics.median(row["ttit_median_ms"] for row in ranks)
    return doc


def start_manifests(cfg, model_cfg: dict, telemetry: str = TELEMETRY) -> dict[Path, dict]:
    """Write every manifest (one per backend's sub-bundle, and a top one listing them) with
    status "running" before any rank starts: a run that dies still leaves a readable bundle."""
    root = Path(cfg.out_dir)
    root.mkdir(parents=True, exist_ok=True)
    manifests = {}
    for b in cfg.backends:
        d = cfg.bundle_dir(b)
        d.mkdir(parents=True, exist_ok=True)
        manifests[d] = manifest(cfg, model_cfg, b, cfg.world_size)
    if len(cfg.backends) > 1:
        top = manifest(cfg, model_cfg, cfg.backends, cfg.world_size)
        top.update(traces=[], timings=None, sub_bundles={b: b for b in cfg.backends})
        manifests[root] = top
    for d, m in manifests.items():
        m["telemetry"] = telemetry if d == root else f"../{telemetry}"
        write_json(d / MANIFEST, m)
    return manifests


def record_hosts(manifests: dict[Path, dict], hosts: dict[int, str]) -> None:
    """Under torchrun: which host ran each rank, and every host's telemetry file."""
    files = sorted({host_telemetry_name(h) for h in hosts.values()})
    root = min(manifests, key=lambda d: len(d.parts))
    for d, m in manifests.items():
        m["world"]["hosts"] = {str(r): h for r, h in hosts.items()}
        m["telemetry_files"] = files if d == root else [f"../{f}" for f in files]


def finish_manifests(manifests: dict[Path, dict], status: str, error: str | None, sampler=None) -> None:
    """Rewrite the manifests with how the run ended ("ok", "failed" with its one-line cause,
    "interrupted"), the traces that exist, and the telemetry sampler's counts."""
    for d, m in manifests.items():
        m.update(status=status, error=error, finished_at=now_iso(),
                 traces=[t for t in m["traces"] if (d / t).exists()])
        if sampler is not None:
            m.update(telemetry_samples=sampler.samples, telemetry_errors=sampler.errors,
                     telemetry_sources=[s.name for s in sampler.sources])
        write_json(d / MANIFEST, m)


def write_timings(cfg, results: list) -> None:
    """timings.json in each backend's sub-bundle."""
    for b in cfg.backends:
        write_json(cfg.bundle_dir(b) / TIMINGS, timings_doc(results, b))
