"""Run the collective sweep on spawned ranks and clean up after the peers it compares against.

DeepSpeed never unlinks its /dev/shm allreduce buffers (about 66 MiB each at world 2 to 4),
so the sweep removes the ones that appeared during its run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from collectives.dda import shm_dir
from collectives.sweep import SweepConfig, sweep_rank

from .launch import launch

PEER_SHM_PATTERNS = ("deepspeed_allreduce_buffer_*",)


def _peer_files() -> set[Path]:
    return {f for pat in PEER_SHM_PATTERNS for f in shm_dir().glob(pat)}


def run_sweep(cfg: SweepConfig, world: int, *, timeout: float, workdir: Path,
              on_poll: Callable[[], None] | None = None) -> dict:
    backend = "nccl" if "nccl" in cfg.backends else "gloo"
    before = _peer_files()
    try:
        return launch(sweep_rank, world, (cfg,), backend=backend, timeout=timeout, on_poll=on_poll,
                      workdir=workdir)[0]
    finally:
        for f in _peer_files() - before:
            f.unlink(missing_ok=True)


def run_time_sharing(cfg, world: int, *, timeout: float, workdir: Path,
                     on_poll: Callable[[], None] | None = None) -> list[dict]:
    """`collectives.timeshare` on `world` spawned ranks (more than the cores)."""
    from collectives.timeshare import time_share_rank

    return launch(time_share_rank, world, (cfg,), backend="gloo", timeout=timeout, on_poll=on_poll,
                  workdir=workdir)[0]
