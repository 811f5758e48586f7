"""DDA (Direct Data Access) collectives on CPU: shared memory across processes.

Every rank of a group maps one shared segment; each rank writes only its own slot and reads
its peers' slots directly, so an allreduce is one copy in, one flag, and a local reduction
(one-shot) or a reduce-scatter plus all-gather both done by direct reads (two-shot). The
hot path is C (`dda_cpu.c`, compiled on first use with the system compiler and cached, as
DeepSpeed does with its kernels); the synchronization and memory-ordering argument is in
that file's header. Without a compiler the same algorithms run in torch over the same
segment, synchronized by the process group's barrier (slower, equally correct: the barrier
is a full fence), and one line says so.

Lifetime: group rank 0 creates the file, every rank maps it, and rank 0 unlinks it as soon
as all have mapped it, so the memory disappears with the last process even when a rank is
killed. The launcher also removes any file of its run (named with COMMPROBE_SHM_TAG) that a
rank dying mid-setup could leave.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import sys
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from commprobe.common.host import cpu_flags, local_world_size, shm_dir, usable_cores
from commprobe.common.native import build_library

from .comm import Ready
from .spans import comm_span

_SRC = Path(__file__).with_name("dda_cpu.c")
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
SHM_PREFIX = "commprobe-dda"
# Per rank and buffer. Large messages move in slot-sized steps; 1 MiB steps stay in this host's
# 1 MiB-per-core L2 and beat 8 MiB steps 3x at 16 MiB (bench/RESULTS.md).
DEFAULT_SLOT_BYTES = 1 << 20
DEFAULT_SPIN_US = 1000.0
# One-shot below, two-shot from this size on; chosen from `commprobe bench collectives` on this
# machine (bench/RESULTS.md); override with twoshot_min_bytes= or COMMPROBE_DDA_TWOSHOT_MIN.
DEFAULT_TWOSHOT_MIN = 32 << 10
# How a rank waits for its peers (dda_cpu.c, "Waiting"); the order is the C enum's. Override with
# wait= or COMMPROBE_DDA_WAIT. The default (`default_wait`) was chosen by measurement, quiet, beside
# a busy process and with ranks > cores, quiet and loaded (bench/wait_modes.py; bench/RESULTS.md,
# "DDA under load"): `adaptive` while the host's ranks fit its cores (as fast as any mode quiet,
# 4.5x faster than spin-then-sleep beside a busy process), `futex` once they outnumber them (a spin
# holds the core the awaited rank needs: `spin` was 60x slower, `adaptive` 1.7x; `yield`, fastest
# with the cores to itself, gives the core to a busy process for a whole slice: 2.8x slower).
WAIT_MODES = ("spin-futex", "futex", "yield", "spin", "adaptive")
_u64p = ctypes.POINTER(ctypes.c_uint64)
_INTERRUPTED = -1000  # DDA_INTERRUPTED in dda_cpu.c


class DDAError(RuntimeError):
    pass


def default_wait() -> str:
    """The wait mode when none is asked for: adaptive while this host's ranks fit its cores,
    futex (sleep at once) when they outnumber them (the measurements above)."""
    return "adaptive" if ranks_on_host() <= usable_cores() else "futex"


def ranks_on_host() -> int:
    """The job's ranks on this host: LOCAL_WORLD_SIZE, else the whole job (a process group of
    unknown layout: assume it shares this host)."""
    return local_world_size(dist.get_world_size() if dist.is_initialized() else 1)


_LIB: ctypes.CDLL | None = None
_LIB_REASON = ""


def load_library() -> tuple[ctypes.CDLL | None, str]:
    """Compile (once per source/CPU, cached) and load the C kernels; (None, why) when impossible."""
    global _LIB, _LIB_REASON
    if _LIB is not None or _LIB_REASON:
        return _LIB, _LIB_REASON
    if os.environ.get("COMMPROBE_DDA_PURE"):
        _LIB_REASON = "COMMPROBE_DDA_PURE is set"
        return None, _LIB_REASON
    lib, _LIB_REASON = build_library(_SRC, ["-O3", "-march=native", "-shared", "-fPIC", "-std=gnu11"],
                                     "the DDA kernels", cpu_flags())
    if lib is None:
        return None, _LIB_REASON
    vp, u64, i32 = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int
    lib.dda_segment_bytes.argtypes, lib.dda_segment_bytes.restype = [i32, u64], u64
    lib.dda_open.argtypes, lib.dda_open.restype = [vp, i32, i32, u64, ctypes.c_double, ctypes.c_double], vp
    lib.dda_close.argtypes, lib.dda_close.restype = [vp], None
    lib.dda_set_spin.argtypes, lib.dda_set_spin.restype = [vp, ctypes.c_double], None
    lib.dda_set_wait.argtypes, lib.dda_set_wait.restype = [vp, i32], i32
    for name in ("dda_allreduce_oneshot", "dda_allreduce_twoshot"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = [vp, vp, vp, u64, i32], i32
    lib.dda_all_gather.argtypes, lib.dda_all_gather.restype = [vp, vp, vp, u64], i32
    lib.dda_all_to_all.argtypes, lib.dda_all_to_all.restype = [vp, vp, _u64p, _u64p, vp, _u64p, _u64p], i32
    lib.dda_send_recv.argtypes, lib.dda_send_recv.restype = [vp, vp, vp, u64, i32, i32], i32
    lib.dda_barrier.argtypes, lib.dda_barrier.restype = [vp], i32
    lib.dda_watch_signals.argtypes, lib.dda_watch_signals.restype = [], i32
    lib.dda_signals_seen.argtypes, lib.dda_signals_seen.restype = [], ctypes.c_uint32
    _LIB = lib
    return lib, ""


def _header_bytes(world: int) -> int:
    return world * 192  # sizeof(rank_hdr_t) in dda_cpu.c


def _u64_array(values: list[int]):
    return (ctypes.c_uint64 * len(values))(*values)


class DDAComm:
    """`Comm` over shared memory with commprobe's own DDA kernels (one process group, one host)."""

    backend = "dda"

    def __init__(self, axis: str, group: dist.ProcessGroup | None = None, ranks: list[int] | None = None, *,
                 slot_bytes: int = DEFAULT_SLOT_BYTES, twoshot_min_bytes: int | None = None,
                 spin_us: float | None = None, wait: str | None = None, timeout: float = 300.0,
                 pure: bool | None = None):
        wait = wait or os.environ.get("COMMPROBE_DDA_WAIT") or default_wait()
        if wait not in WAIT_MODES:
            raise ValueError(f"unknown DDA wait mode {wait!r}; choose one of {', '.join(WAIT_MODES)}")
        self.wait = wait
        self.axis, self.group = axis, group
        self.ranks = ranks if ranks is not None else list(range(dist.get_world_size()))
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        env_slot = os.environ.get("COMMPROBE_DDA_SLOT")
        slot_bytes = int(env_slot) if env_slot else slot_bytes
        self.slot_bytes = (slot_bytes + 63) // 64 * 64
        env_min = os.environ.get("COMMPROBE_DDA_TWOSHOT_MIN")
        self.twoshot_min_bytes = twoshot_min_bytes if twoshot_min_bytes is not None else (
            int(env_min) if env_min else DEFAULT_TWOSHOT_MIN)
        lib, why = (None, "pure path requested") if pure else load_library()
        self._lib = lib
        self.compiled = lib is not None
        if not self.compiled and self.rank == 0:
            print(f"commprobe: DDA runs its torch fallback (slower): {why}", file=sys.stderr)
        # Spin only while this host's ranks fit on the cores (a spinning rank then wastes nothing
        # but its own idle core); oversubscribed, sleep at once so the rank we wait for can run.
        # All of the job's ranks here count, not this group's: a TP pair of a TP2xCP2 job on 2
        # cores spun while the other pair waited for the core (bench/RESULTS.md, "Cost model validation", the DDA fix).
        env_spin = os.environ.get("COMMPROBE_DDA_SPIN_US")
        # The adaptive mode finds its own budget below this ceiling, so it keeps the full one.
        self.spin_us = spin_us if spin_us is not None else float(env_spin) if env_spin else (
            DEFAULT_SPIN_US if wait == "adaptive" or ranks_on_host() <= usable_cores() else 0.0)
        self._k = 0
        self._closed = False
        # A slower link, emulated: a known delay inside every allreduce's span, so that what the
        # analyzers and the gate report of a slowdown can be checked against its true size.
        self._delay_s = float(os.environ.get("COMMPROBE_DDA_DELAY_US", "0")) * 1e-6
        seg = self._segment_bytes()
        self._mm = self._map_segment(seg)
        self._buf = torch.frombuffer(self._mm, dtype=torch.uint8)
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self._mm))
        self._ctx = None
        if lib is not None:
            self._ctx = lib.dda_open(self._base, self.world_size, self.rank, self.slot_bytes, self.spin_us, float(timeout))
            if not self._ctx:
                raise DDAError("dda_open rejected the group layout")
            lib.dda_set_wait(self._ctx, WAIT_MODES.index(wait))
            # Ctrl-C (and a SIGTERM with a handler) ends a wait at once, not at the timeout: the
            # call returns and Python raises the handler's exception (dda_cpu.c, "Signals").
            lib.dda_watch_signals()

    # ---- setup and teardown ----

    def _segment_bytes(self) -> int:
        return _header_bytes(self.world_size) + 2 * self.world_size * self.slot_bytes

    def _map_segment(self, size: int) -> mmap.mmap:
        tag = os.environ.get("COMMPROBE_SHM_TAG", str(os.getpid()))
        name = [f"{SHM_PREFIX}-{tag}-{uuid.uuid4().hex[:12]}" if self.rank == 0 else None]
        if self.world_size > 1:
            dist.broadcast_object_list(name, src=self.ranks[0], group=self.group)
        path = shm_dir() / name[0]
        try:
            if self.rank == 0:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                try:
                    os.ftruncate(fd, size)
                except OSError as e:
                    os.close(fd)
                    path.unlink(missing_ok=True)
                    raise DDAError(f"cannot size shared segment {path} to {size} bytes: {e}") from None
            self._barrier_setup()
            if self.rank != 0:
                fd = os.open(path, os.O_RDWR)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            os.close(fd)
            self._barrier_setup()  # everyone has mapped it: the name is no longer needed
        finally:
            if self.rank == 0:
                path.unlink(missing_ok=True)
        return mm

    def _barrier_setup(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self.group)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._ctx and self._lib is not None:
            self._lib.dda_close(self._ctx)
            self._ctx = None
        del self._buf
        try:
            self._mm.close()
        except BufferError:
            pass  # a tensor view still refers to it; the mapping goes when that is collected

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---- helpers ----

    def _check(self, rc: int, op: str) -> None:
        if rc == _INTERRUPTED:  # Python has run the signal's handler by now; it did not raise
            raise DDAError(f"DDA {op} on axis {self.axis}: interrupted by a signal; the group is out of step")
        if rc < 0:
            peer = -rc - 1
            raise DDAError(f"DDA {op} on axis {self.axis}: timed out waiting for group rank {peer}")

    def _span(self, op: str, x: Tensor, splits: tuple[list[int], list[int]] | None = None):
        return comm_span(self.axis, op, x, self.world_size, "dda", (self.rank, *splits) if splits is not None else None)

    def _dtype_code(self, x: Tensor) -> int:
        try:
            return _DTYPES[x.dtype]
        except KeyError:
            raise TypeError(f"DDA allreduce supports float32, bfloat16 and float16, not {x.dtype}") from None

    # ---- Comm interface ----

    def all_reduce(self, x: Tensor) -> Tensor:
        if self.world_size == 1 or x.numel() == 0:
            return x
        code = self._dtype_code(x)
        y = x if x.is_contiguous() else x.contiguous()
        nbytes = y.numel() * y.element_size()
        twoshot = nbytes >= self.twoshot_min_bytes
        with self._span("all_reduce", y):
            if self._delay_s:
                time.sleep(self._delay_s)
            if self._lib is not None:
                fn = self._lib.dda_allreduce_twoshot if twoshot else self._lib.dda_allreduce_oneshot
                self._check(fn(self._ctx, y.data_ptr(), y.data_ptr(), y.numel(), code), "all_reduce")
            else:
                _pure_allreduce(self, y, twoshot)
        if y is not x:
            x.copy_(y)
        return x

    def all_gather(self, x: Tensor) -> Tensor:
        if self.world_size == 1:
            return x
        y = x.contiguous()
        out = y.new_empty((self.world_size * y.shape[0], *y.shape[1:]))
        with self._span("all_gather", y):
            nbytes = y.numel() * y.element_size()
            if self._lib is not None:
                self._check(self._lib.dda_all_gather(self._ctx, y.data_ptr(), out.data_ptr(), nbytes), "all_gather")
            else:
                _pure_all_gather(self, y, out)
        return out

    def all_to_all(self, x: Tensor, in_splits: list[int], out_splits: list[int]) -> Tensor:
        if self.world_size == 1:
            return x
        y = x.contiguous()
        row = math.prod(y.shape[1:]) * y.element_size()  # y may have no rows (a rank with no tokens)
        out = y.new_empty((sum(out_splits), *y.shape[1:]))
        in_len = [s * row for s in in_splits]
        out_len = [s * row for s in out_splits]
        in_off = [sum(in_len[:i]) for i in range(len(in_len))]
        out_off = [sum(out_len[:i]) for i in range(len(out_len))]
        with self._span("all_to_all", y, (in_splits, out_splits)):
            if self._lib is not None:
                rc = self._lib.dda_all_to_all(self._ctx, y.data_ptr(), _u64_array(in_off), _u64_array(in_len),
                                              out.data_ptr(), _u64_array(out_off), _u64_array(out_len))
                self._check(rc, "all_to_all")
            else:
                _pure_all_to_all(self, y, in_off, in_len, out, out_off, out_len)
        return out

    def send_recv(self, x: Tensor, dst: int, src: int) -> Tensor:
        """Ring exchange: every rank of the group calls it together with the same shape."""
        if self.world_size == 1:
            return x
        y = x.contiguous()
        out = torch.empty_like(y)
        with self._span("send_recv", y):
            nbytes = y.numel() * y.element_size()
            if self._lib is not None:
                self._check(self._lib.dda_send_recv(self._ctx, y.data_ptr(), out.data_ptr(), nbytes, dst, src), "send_recv")
            else:
                _pure_send_recv(self, y, out, src)
        return out

    def send_recv_start(self, x: Tensor, dst: int, src: int) -> Ready:
        """DDA moves bytes with this rank's own CPU, so the transfer happens here, synchronously."""
        return Ready(self.send_recv(x, dst, src))

    def barrier(self) -> None:
        if self.world_size == 1:
            return
        if self._lib is not None:
            self._check(self._lib.dda_barrier(self._ctx), "barrier")
        else:
            self._barrier_setup()


# ---- the same algorithms in torch, synchronized by the process group's barrier ----
# One barrier per step suffices with double buffering: a rank can write buffer k & 1 again
# (step k + 2) only after the barrier of step k + 1, which every peer reaches after it has
# finished reading step k.


def _slot(c: DDAComm, k: int, r: int) -> Tensor:
    start = _header_bytes(c.world_size) + ((k & 1) * c.world_size + r) * c.slot_bytes
    return c._buf[start:start + c.slot_bytes]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _step(c: DDAComm) -> int:
    c._k += 1
    return c._k


def _pure_allreduce(c: DDAComm, y: Tensor, twoshot: bool) -> None:
    flat = y.view(-1)
    es, w = y.element_size(), c.world_size
    per = c.slot_bytes // es
    for off in range(0, flat.numel(), per):
        part = flat[off:off + per]
        m = part.numel()
        k = _step(c)
        _slot(c, k, c.rank)[:m * es].copy_(part.view(torch.uint8))
        c._barrier_setup()
        views = [_slot(c, k, p)[:m * es].view(y.dtype) for p in range(w)]
        if not twoshot:
            part.copy_(_sum_in_order(views))
            continue
        line = 64 // es
        chunk = _ceil_div(_ceil_div(m, w), line) * line
        lo, hi = c.rank * chunk, min(m, (c.rank + 1) * chunk)
        if lo < hi:
            views[c.rank][lo:hi].copy_(_sum_in_order([v[lo:hi] for v in views]))
        c._barrier_setup()
        for p in range(w):
            plo, phi = p * chunk, min(m, (p + 1) * chunk)
            if plo < phi:
                part[plo:phi].copy_(views[p][plo:phi])


def _sum_in_order(views: list[Tensor]) -> Tensor:
    """Rank order, accumulated in fp32, as the C kernel does, so both paths agree."""
    acc = views[0].float() + views[1].float()
    for v in views[2:]:
        acc += v.float()
    return acc.to(views[0].dtype)


def _published_chunks(c: DDAComm, src: Tensor):
    """Publish `src` slot-sized chunk by chunk; yield (offset, length, step) once every rank has too."""
    n = src.numel()
    for off in range(0, n, c.slot_bytes):
        m = min(c.slot_bytes, n - off)
        k = _step(c)
        _slot(c, k, c.rank)[:m].copy_(src[off:off + m])
        c._barrier_setup()
        yield off, m, k


def _pure_all_gather(c: DDAComm, y: Tensor, out: Tensor) -> None:
    src, dst = y.view(-1).view(torch.uint8), out.view(-1).view(torch.uint8)
    n = src.numel()
    for off, m, k in _published_chunks(c, src):
        for p in range(c.world_size):
            dst[p * n + off:p * n + off + m].copy_(_slot(c, k, p)[:m])


def _pure_all_to_all(c: DDAComm, y: Tensor, in_off, in_len, out: Tensor, out_off, out_len) -> None:
    src, dst = y.view(-1).view(torch.uint8), out.view(-1).view(torch.uint8)
    w = c.world_size
    cap = c.slot_bytes // w // 64 * 64
    need = torch.tensor([max(1, max(_ceil_div(n, cap) for n in in_len))])
    dist.all_reduce(need, op=dist.ReduceOp.MAX, group=c.group)
    for r in range(int(need.item())):
        k = _step(c)
        mine = _slot(c, k, c.rank)
        for d in range(w):
            o = r * cap
            if o < in_len[d]:
                m = min(cap, in_len[d] - o)
                mine[d * cap:d * cap + m].copy_(src[in_off[d] + o:in_off[d] + o + m])
        c._barrier_setup()
        for p in range(w):
            o = r * cap
            if o < out_len[p]:
                m = min(cap, out_len[p] - o)
                dst[out_off[p] + o:out_off[p] + o + m].copy_(_slot(c, k, p)[c.rank * cap:c.rank * cap + m])


def _pure_send_recv(c: DDAComm, y: Tensor, out: Tensor, src_rank: int) -> None:
    src, dst = y.view(-1).view(torch.uint8), out.view(-1).view(torch.uint8)
    for off, m, k in _published_chunks(c, src):
        dst[off:off + m].copy_(_slot(c, k, src_rank)[:m])
