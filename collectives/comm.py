"""The `Comm` interface the reference model talks to, and its torch.distributed implementation.

A `Comm` is one process group seen from one rank, labelled with the parallelism axis it
serves (tp, cp, ep). Every call is wrapped in a profiler span whose name carries axis, op,
bytes, dtype, group size and backend, so the analyzers attribute our own runs without
guessing:  ``commprobe/comm/{axis}/{op}/bytes={n}/dtype={t}/group={g}/backend={b}``.

Collectives know nothing of models: the model sees only these methods.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist
from torch import Tensor

from .spans import comm_span


@runtime_checkable
class Comm(Protocol):
    axis: str
    backend: str
    rank: int
    world_size: int

    def all_reduce(self, x: Tensor) -> Tensor:
        """Sum over the group; returns the reduced tensor (may be `x` itself, modified in place)."""

    def all_gather(self, x: Tensor) -> Tensor:
        """Concatenate every rank's `x` along dim 0, in rank order."""

    def all_to_all(self, x: Tensor, in_splits: list[int], out_splits: list[int]) -> Tensor:
        """Rows x[sum(in_splits[:j]) : ...] go to rank j; returns the rows received, in rank order."""

    def send_recv(self, x: Tensor, dst: int, src: int) -> Tensor:
        """Send `x` to group rank `dst` while receiving a tensor of the same shape from `src`."""

    def send_recv_start(self, x: Tensor, dst: int, src: int) -> Pending:
        """Start `send_recv`; compute may run before `.wait()` returns the received tensor (ring overlap)."""

    def barrier(self) -> None: ...


@runtime_checkable
class Pending(Protocol):
    def wait(self) -> Tensor: ...


class Ready:
    """A `Pending` that already holds its result (backends whose transfers are synchronous)."""

    def __init__(self, out: Tensor):
        self.out = out

    def wait(self) -> Tensor:
        return self.out


class _TorchPending:
    """In-flight isend/irecv pair; the profiler span covers the wait, i.e. the exposed part."""

    def __init__(self, comm: TorchComm, x: Tensor, out: Tensor, reqs: list):
        self.comm, self.x, self.out, self.reqs = comm, x, out, reqs  # x kept alive until sent

    def wait(self) -> Tensor:
        with self.comm._span("send_recv", self.x):
            for req in self.reqs:
                req.wait()
        self.x = None
        return self.out


# torch 2.13 renamed all_gather_into_tensor (now deprecated, with a warning per call).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class TorchComm:
    """`Comm` over a torch.distributed process group (gloo on CPU, nccl on CUDA/ROCm)."""

    def __init__(self, axis: str, group: dist.ProcessGroup | None = None, ranks: list[int] | None = None):
        self.axis = axis
        self.group = group
        self.ranks = ranks if ranks is not None else list(range(dist.get_world_size()))
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group))

    def _span(self, op: str, x: Tensor, splits: tuple[list[int], list[int]] | None = None):
        return comm_span(self.axis, op, x, self.world_size, self.backend,
                         (self.rank, *splits) if splits is not None else None)

    def all_reduce(self, x: Tensor) -> Tensor:
        if self.world_size == 1:
            return x
        with self._span("all_reduce", x):
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: Tensor) -> Tensor:
        if self.world_size == 1:
            return x
        with self._span("all_gather", x):
            out = x.new_empty((self.world_size * x.shape[0], *x.shape[1:]))
            _all_gather_single(out, x.contiguous(), group=self.group)
        return out

    def all_to_all(self, x: Tensor, in_splits: list[int], out_splits: list[int]) -> Tensor:
        if self.world_size == 1:
            return x
        with self._span("all_to_all", x, (in_splits, out_splits)):
            out = x.new_empty((sum(out_splits), *x.shape[1:]))
            dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=self.group)
        return out

    def send_recv(self, x: Tensor, dst: int, src: int) -> Tensor:
        return self.send_recv_start(x, dst, src).wait()

    def send_recv_start(self, x: Tensor, dst: int, src: int) -> Pending:
        if self.world_size == 1:
            return Ready(x)
        x = x.contiguous()
        out = torch.empty_like(x)
        ops = [
            dist.P2POp(dist.isend, x, self.ranks[dst], self.group),
            dist.P2POp(dist.irecv, out, self.ranks[src], self.group),
        ]
        return _TorchPending(self, x, out, dist.batch_isend_irecv(ops))

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self.group)
