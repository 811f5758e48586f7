"""`commprobe bench`: the per-rank bodies of each benchmark (`sweep.py`: the nccl-tests-style
collective sweep; `timeshare.py`: ranks beyond the cores) and their launchers here. Standalone
benchmark scripts and their tables live in the repository's bench/ folder.

DeepSpeed never unlinks its /dev/shm allreduce buffers (about 66 MiB each at world 2 to 4),
so the sweep removes the ones that appeared during its run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from commprobe.collectives.backends import process_group_backend
from commprobe.common.host import shm_dir

from ..launch import launch
from .load import busy_load
from .sweep import SweepConfig, sweep_rank

PEER_SHM_PATTERNS = ("deepspeed_allreduce_buffer_*",)


def _peer_files() -> set[Path]:
    return {f for pat in PEER_SHM_PATTERNS for f in shm_dir().glob(pat)}


def run_sweep(cfg: SweepConfig, world: int, *, timeout: float, workdir: Path,
              on_poll: Callable[[], None] | None = None) -> dict:
    backend = process_group_backend(cfg.backends)
    before = _peer_files()
    try:
        with busy_load(cfg.load, timeout + 60):
            # capture_output: a peer library's log lines (DeepSpeed prints on stdout) go to the ranks'
            # logs, so `--json` stdout stays one JSON document
            return launch(sweep_rank, world, (cfg,), backend=backend, timeout=timeout, on_poll=on_poll,
                          workdir=workdir, capture_output=True)[0]
    finally:
        for f in _peer_files() - before:
            f.unlink(missing_ok=True)


def run_time_sharing(cfg, world: int, *, timeout: float, workdir: Path,
                     on_poll: Callable[[], None] | None = None) -> list[dict]:
    """`timeshare` on `world` spawned ranks (more than the cores)."""
    from .timeshare import time_share_rank

    return launch(time_share_rank, world, (cfg,), backend="gloo", timeout=timeout, on_poll=on_poll,
                  workdir=workdir, capture_output=True)[0]
