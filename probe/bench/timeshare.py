"""What ranks that outnumber the cores cost beyond ranks/cores: a side-by-side benchmark.

A decode step is compute, then a collective, again and again. On a host whose ranks
outnumber its cores (4 ranks on 2), a rank that reaches a collective first sleeps (DDA
sleeps at once when oversubscribed), and the peer it waits for shares a core with another
rank; waking it, and the imbalance between cores at every call, cost time that the plain
time-sharing factor s = ranks/cores does not contain and that a tight loop of collectives
alone does not show (the ranks then arrive together).

One launch of `world` ranks measures, per work size, alternately (A B A B ..., medians):
  A  the first `cores` ranks only (one per core; the others sleep in a barrier): work, then a
     collective among them;
  B  all ranks: the same work per rank, then a collective among all.
Ideal time-sharing makes B = s x A; what B takes beyond that, per call and per extra rank per
core, is `extra_us`, measured at `interval_us` = s x A between calls. The work streams
`work_bytes` of fp32 weights per rank through a matrix-vector product (cycling over 128 MiB,
so it reads memory, as decode reads weights). Measured side by side in one launch because
this machine's speed drifts by tens of percent between minutes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from commprobe.collectives.dda import DEFAULT_SPIN_US

from .sweep import slowest

WORK_CYCLE_BYTES = 128 << 20  # more than any L3 here: each call's work reads from memory


@dataclass
class TimeShareConfig:
    """One `commprobe bench time-sharing` run; checked when built (one-line ValueError)."""

    work_bytes: list[int] = field(default_factory=lambda: [256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20])
    """Weight bytes each rank streams through a matrix-vector product before every call."""
    message_bytes: int = 4096
    """The allreduce after each piece of work (a decode allreduce: batch x dim x 4 bytes)."""
    backend: str = "dda"
    """dda or gloo."""
    cores: int = 2
    """Ranks that run alone in A: one per usable core."""
    rounds: int = 7
    """Alternated rounds (A B A B ...); medians are reported."""
    target_batch_s: float = 0.1
    """Calls per batch are chosen so that a batch takes about this long."""
    progress_file: str | None = None
    """Rank 0 writes its progress here."""

    def __post_init__(self) -> None:
        if self.backend not in ("dda", "gloo"):
            raise ValueError(f"unknown backend {self.backend!r} (time-sharing knows dda, gloo)")
        if not self.work_bytes or self.rounds < 1:
            raise ValueError("need at least one --work size and --rounds >= 1")

    def check_world(self, world: int) -> None:
        """This benchmark measures ranks that time-share cores: more ranks than cores, at most 4 per core."""
        if world <= self.cores or world > 4 * self.cores:
            raise ValueError(f"--world must exceed the {self.cores} usable cores here (and be at most "
                             f"{4 * self.cores}): this measures ranks that time-share cores")


@dataclass
class TimeShareRow:
    bench: str  # "time-sharing": what `plan calibrate` recognises
    backend: str
    world: int
    cores: int
    work_bytes: int
    message_bytes: int
    calls: int  # per timed batch
    base_us: list[float]  # A per call, each round (slowest of the `cores` ranks)
    shared_us: list[float]  # B per call, each round (slowest rank)
    interval_us: float  # s x median A: the time between calls under ideal time-sharing
    extra_us: float  # (median B - s x median A) / (s - 1), at least 0

    def to_dict(self) -> dict:
        return asdict(self)


def work_fn(work_bytes: int) -> Callable[[], object]:
    """A matrix-vector product over `work_bytes` of fp32 weights, a different matrix each call."""
    rows = max(1, work_bytes // (4 * 1024))
    mats = [torch.rand(rows, 1024) for _ in range(max(1, WORK_CYCLE_BYTES // (rows * 4096)))]
    v = torch.rand(1024)
    state = [0]

    def work() -> object:
        state[0] = (state[0] + 1) % len(mats)
        return torch.mv(mats[state[0]], v)

    return work


def time_share_rank(cfg: TimeShareConfig) -> list[dict]:
    """Body of each rank; returns the rows (identical on every rank)."""
    from commprobe.collectives.backends import make_comm

    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    if not 1 <= cfg.cores < world:
        raise ValueError(f"time-sharing needs more ranks ({world}) than cores ({cfg.cores})")
    base_ranks = list(range(cfg.cores))
    base_group = dist.new_group(base_ranks) if cfg.cores > 1 else None  # every rank must create it
    member = rank in base_ranks
    # A stands for a job of `cores` ranks alone on the host: DDA spins there before sleeping,
    # as it would (it would sleep at once here, seeing all of this job's ranks).
    opts = {"spin_us": DEFAULT_SPIN_US} if cfg.backend == "dda" and not torch.cuda.is_available() else {}
    base = make_comm(cfg.backend, "base", base_group, base_ranks, **opts) if member and cfg.cores > 1 else None
    full = make_comm(cfg.backend, "all")
    x = torch.rand(max(1, cfg.message_bytes // 4))
    s = world / cfg.cores
    rows = []
    for i, wb in enumerate(cfg.work_bytes):
        work = work_fn(wb)

        def step_base() -> None:
            work()
            if base is not None:
                base.all_reduce(x)

        def step_all() -> None:
            work()
            full.all_reduce(x)

        def batch(fn: Callable[[], None], calls: int, active: bool) -> float:
            dist.barrier()  # the ranks not in A sleep here while A runs
            t0 = time.perf_counter()
            if active:
                for _ in range(calls):
                    fn()
            return slowest(time.perf_counter() - t0 if active else 0.0) / calls

        batch(step_all, 10, True)  # warm-up: first touches, DDA's first calls (slow for a while)
        batch(step_base, 10, member)
        calls = max(3, int(cfg.target_batch_s / max(batch(step_base, 10, member), 1e-7)))
        a, b = [], []
        for _ in range(cfg.rounds):
            a.append(batch(step_base, calls, member) * 1e6)
            b.append(batch(step_all, max(2, int(calls / s)), True) * 1e6)
        ma, mb = statistics.median(a), statistics.median(b)
        rows.append(TimeShareRow("time-sharing", cfg.backend, world, cfg.cores, wb, cfg.message_bytes, calls, a, b,
                                 s * ma, max(0.0, mb - s * ma) / (s - 1)).to_dict())
        if rank == 0 and cfg.progress_file:
            Path(cfg.progress_file).write_text(f"{i + 1} {len(cfg.work_bytes)}")
    for c in (base, full):
        if c is not None and hasattr(c, "close"):
            c.close()
    return rows
