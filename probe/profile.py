"""`commprobe profile` as a library call: launch the ranks, sample telemetry, write the bundle.

Whatever happens to the ranks, the bundle keeps what was written: the manifest is written
first with status "running" and rewritten at the end with "ok", "failed" (and the one-line
cause) or "interrupted"; traces the ranks finished stay on disk.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import bundle
from .launch import LaunchError, launch
from .run import RankResult, RunConfig, run_rank
from .telemetry import TelemetrySampler


@dataclass
class ProfileOutcome:
    results: list[RankResult]
    bundle_dirs: dict[str, Path]
    telemetry_line: str


def _timings_doc(results: list[RankResult], backend: str) -> dict:
    ranks = []
    for r in results:
        t, p = r.timings[backend], r.profiled.get(backend)
        row = {**t.summary(), "samples": {"ttft_s": t.ttft_s, "ttit_s": t.ttit_s,
                                          "decode_allreduce_s": t.decode_allreduce_s}}
        if p is not None and p.ttit_s:
            row["profiled"] = {**p.summary(), "samples": {"ttft_s": p.ttft_s, "ttit_s": p.ttit_s}}
        ranks.append(row)
    doc = {"schema": bundle.SCHEMA, "backend": backend, "ranks": ranks}
    prof = [row["profiled"]["ttit_median_ms"] for row in ranks if "profiled" in row]
    if prof:
        doc["profiler_overhead_ttit"] = statistics.median(prof) / statistics.median(row["ttit_median_ms"] for row in ranks)
    return doc


def run_profile(cfg: RunConfig, model_cfg: dict, *, pg_backend: str, telemetry_interval: float = 0.05,
                on_status: Callable[[str], None] = lambda s: None) -> ProfileOutcome:
    root = Path(cfg.out_dir)
    root.mkdir(parents=True, exist_ok=True)
    dirs = {b: cfg.bundle_dir(b) for b in cfg.backends}
    manifests = {}
    for b, d in dirs.items():
        d.mkdir(parents=True, exist_ok=True)
        m = bundle.manifest(cfg, model_cfg, b, cfg.world_size)
        if d != root:
            m["telemetry"] = "../telemetry.jsonl"
        manifests[d] = m
    if len(cfg.backends) > 1:
        top = bundle.manifest(cfg, model_cfg, cfg.backends, cfg.world_size)
        top.update(traces=[], timings=None, sub_bundles={b: b for b in cfg.backends})
        manifests[root] = top
    for d, m in manifests.items():
        bundle.write_json(d / "manifest.json", m)

    pids: dict[int, int] = {}
    status, error = "failed", None
    sampler = TelemetrySampler(root / "telemetry.jsonl", telemetry_interval, pids=lambda: dict(pids))
    on_status(sampler.status_line)
    try:
        with sampler:
            results = launch(run_rank, cfg.world_size, (cfg,), backend=pg_backend, timeout=cfg.timeout,
                             workdir=root / "ranks", on_start=pids.update, capture_output=True)
        status = "ok"
    except LaunchError as e:
        error = str(e)
        raise
    except KeyboardInterrupt:
        status, error = "interrupted", "interrupted by the user (Ctrl-C)"
        raise
    finally:
        for d, m in manifests.items():
            m.update(status=status, error=error, finished_at=bundle.now_iso(),
                     traces=[t for t in m["traces"] if (d / t).exists()],
                     telemetry_samples=sampler.samples, telemetry_errors=sampler.errors,
                     telemetry_sources=[s.name for s in sampler.sources])
            bundle.write_json(d / "manifest.json", m)
    for b, d in dirs.items():
        bundle.write_json(d / "timings.json", _timings_doc(results, b))
    return ProfileOutcome(results, dirs, sampler.status_line)
