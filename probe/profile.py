"""`commprobe profile` as a library call: launch the ranks, sample telemetry, write the bundle.

Whatever happens to the ranks, the bundle keeps what was written: the manifest is written
first with status "running" and rewritten at the end with "ok", "failed" (and the one-line
cause) or "interrupted"; traces the ranks finished stay on disk.
"""

from __future__ import annotations

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


def hang_finding(root: Path) -> str | None:
    """The first finding of the hang diagnosis over the bundle's Flight Recorder records, as the
    one line `profile` adds to its hang or failure line; None when there are no records."""
    from commprobe.analyzers.hang import analyze_hang
    from commprobe.common.errors import InputError

    if not (root / bundle.FLIGHT_RECORDER).is_dir():
        return None
    try:
        findings = analyze_hang(root)["findings"]
    except InputError:
        return None
    # a rank's own death is already the launcher's line; a finding adds what it does not know
    told = [f for f in findings if f["kind"] not in ("rank_died", "no_records")]
    return told[0]["summary"] if told else None


def run_profile(cfg: RunConfig, model_cfg: dict, *, pg_backend: str, telemetry_interval: float = 0.05,
                on_status: Callable[[str], None] = lambda s: None) -> ProfileOutcome:
    """One host: spawn the ranks, sample this host, write the whole bundle."""
    root = Path(cfg.out_dir)
    manifests = bundle.start_manifests(cfg, model_cfg)
    pids: dict[int, int] = {}
    status, error = "failed", None
    sampler = TelemetrySampler(root / bundle.TELEMETRY, telemetry_interval, pids=lambda: dict(pids),
                               ranks_on_host=cfg.world_size)
    on_status(sampler.status_line)
    try:
        with sampler:
            results = launch(run_rank, cfg.world_size, (cfg,), backend=pg_backend, timeout=cfg.timeout,
                             workdir=root / "ranks", on_start=pids.update, capture_output=True,
                             forensics=root / bundle.FLIGHT_RECORDER)
        status = "ok"
    except LaunchError as e:
        e.finding = hang_finding(root)
        error = f"{e}; {e.finding}" if e.finding else str(e)
        raise
    except KeyboardInterrupt:
        status, error = "interrupted", "interrupted by the user (Ctrl-C)"
        raise
    finally:
        bundle.finish_manifests(manifests, status, error, sampler)
    bundle.write_timings(cfg, results)
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
    name = bundle.host_telemetry_name(host_name())
    manifests = bundle.start_manifests(cfg, model_cfg, telemetry=name) if rank == 0 else {}
    # under torchrun the sampler sees its own rank only; the others here are named by their count, so
    # an analysis does not take their CPU time for other work (readers/telemetry.host_contention)
    sampler = TelemetrySampler(root / name, telemetry_interval, pids=rank_pids_from_env,
                               ranks_on_host=int(os.environ.get("LOCAL_WORLD_SIZE", 1))) if local == 0 else None
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
                bundle.record_hosts(manifests, {r.rank: r.host for r in results})
            bundle.finish_manifests(manifests, status, error, sampler)
    if rank == 0:
        bundle.write_timings(cfg, results)
    return results
