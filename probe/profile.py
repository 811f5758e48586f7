"""`commprobe profile` as a library call: launch the ranks, sample telemetry, write the bundle.

Whatever happens to the ranks, the bundle keeps what was written: the manifest is written
first with status "running" and rewritten at the end with "ok", "failed" (and the one-line
cause) or "interrupted"; traces the ranks finished stay on disk.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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
                                          "decode_allreduce_s": t.decode_allreduce_s,
                                          "prefill_comm_s": t.prefill_comm_s, "decode_comm_s": t.decode_comm_s}}
        if t.routed_tokens:
            row["routed_tokens"] = t.routed_tokens
        if p is not None and p.ttit_s:
            row["profiled"] = {**p.summary(), "samples": {"ttft_s": p.ttft_s, "ttit_s": p.ttit_s}}
        ranks.append(row)
    doc = {"schema": bundle.SCHEMA, "backend": backend, "ranks": ranks}
    prof = [row["profiled"]["ttit_median_ms"] for row in ranks if "profiled" in row]
    if prof:
        doc["profiler_overhead_ttit"] = statistics.median(prof) / statistics.median(row["ttit_median_ms"] for row in ranks)
    return doc


def _start_manifests(cfg: RunConfig, model_cfg: dict) -> dict[Path, dict]:
    root = Path(cfg.out_dir)
    root.mkdir(parents=True, exist_ok=True)
    manifests = {}
    for b in cfg.backends:
        d = cfg.bundle_dir(b)
        d.mkdir(parents=True, exist_ok=True)
        m = bundle.manifest(cfg, model_cfg, b, cfg.world_size)
        if d != root:
            m["telemetry"] = f"../{bundle.TELEMETRY}"
        manifests[d] = m
    if len(cfg.backends) > 1:
        top = bundle.manifest(cfg, model_cfg, cfg.backends, cfg.world_size)
        top.update(traces=[], timings=None, sub_bundles={b: b for b in cfg.backends})
        manifests[root] = top
    for d, m in manifests.items():
        bundle.write_json(d / bundle.MANIFEST, m)
    return manifests


def _finish_manifests(manifests: dict[Path, dict], status: str, error: str | None,
                      sampler: TelemetrySampler | None) -> None:
    for d, m in manifests.items():
        m.update(status=status, error=error, finished_at=bundle.now_iso(),
                 traces=[t for t in m["traces"] if (d / t).exists()])
        if sampler is not None:
            m.update(telemetry_samples=sampler.samples, telemetry_errors=sampler.errors,
                     telemetry_sources=[s.name for s in sampler.sources])
        bundle.write_json(d / bundle.MANIFEST, m)


def _write_timings(cfg: RunConfig, results: list[RankResult]) -> None:
    for b in cfg.backends:
        bundle.write_json(cfg.bundle_dir(b) / bundle.TIMINGS, _timings_doc(results, b))


def run_profile(cfg: RunConfig, model_cfg: dict, *, pg_backend: str, telemetry_interval: float = 0.05,
                on_status: Callable[[str], None] = lambda s: None) -> ProfileOutcome:
    """One host: spawn the ranks, sample this host, write the whole bundle."""
    root = Path(cfg.out_dir)
    manifests = _start_manifests(cfg, model_cfg)
    pids: dict[int, int] = {}
    status, error = "failed", None
    sampler = TelemetrySampler(root / bundle.TELEMETRY, telemetry_interval, pids=lambda: dict(pids))
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
        _finish_manifests(manifests, status, error, sampler)
    _write_timings(cfg, results)
    return ProfileOutcome(results, {b: cfg.bundle_dir(b) for b in cfg.backends}, sampler.status_line)


def run_profile_torchrun(cfg: RunConfig, model_cfg: dict, *, pg_backend: str,
                         telemetry_interval: float = 0.05) -> list[RankResult]:
    """Under torchrun (many hosts): this process is one rank. Each host's local rank 0 samples its
    host into telemetry-HOST.jsonl; global rank 0 writes the manifests and timings of the run."""
    import os

    from commprobe.common.host import host_name

    from .launch import run_this_rank
    from .telemetry import rank_pids_from_env

    rank, local = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    root = Path(cfg.out_dir)
    name = f"telemetry-{host_name()}.jsonl"
    manifests = _start_manifests(cfg, model_cfg) if rank == 0 else {}
    for d, m in manifests.items():  # one telemetry file per host
        m["telemetry"] = name if d == root else f"../{name}"
    sampler = TelemetrySampler(root / name, telemetry_interval, pids=rank_pids_from_env) if local == 0 else None
    status, error = "failed", None
    try:
        if sampler is not None:
            sampler.__enter__()
        results = run_this_rank(run_rank, (cfg,), backend=pg_backend, timeout=cfg.timeout, gather=True)
        status = "ok"
    except BaseException as e:
        error = f"rank {rank}: {type(e).__name__}: {e}"
        raise
    finally:
        if sampler is not None:
            sampler.__exit__(None, None, None)
        if manifests:
            if status == "ok":  # every rank's host, and every host's telemetry file
                hosts = {str(r.rank): r.host for r in results}
                files = sorted({f"telemetry-{h}.jsonl" for h in hosts.values()})
                for d, m in manifests.items():
                    m["world"]["hosts"] = hosts
                    m["telemetry_files"] = files if d == root else [f"../{f}" for f in files]
            _finish_manifests(manifests, status, error, sampler)
    if rank == 0:
        _write_timings(cfg, results)
    return results
