"""Profiler spans for collectives, at no cost when no profiler is running.

`torch.profiler.record_function` costs about 7 µs a call on this machine even with the
profiler off: as much as a whole small DDA allreduce. So the span is opened only while a
profiler is active (a flag read, about 0.07 µs).
"""

from __future__ import annotations

import contextlib
import math
import os
import time

import torch
import torch.autograd.profiler as _prof

SPAN_PREFIX = "commprobe/comm"
_NULL = contextlib.nullcontext()
# An emulated slower transport: seconds added inside every collective's span on an axis (all ranks
# alike, so it is transfer time, not waiting). Set by the probe's fault injection
# (COMMPROBE_FAULT=slow-link:AXIS@US); empty, it costs one dict lookup a call.
LINK_DELAY_S: dict[str, float] = {}


def pause(seconds: float) -> None:
    """Wait `seconds` precisely and yielding the core: sleep all but the last 150 µs (a sleep
    overshoots by the kernel's timer slack, ~50-100 µs), then yield until the deadline. An emulated
    delay of known size must take that size, or what the analysis finds cannot be checked."""
    end = time.perf_counter() + seconds
    if seconds > 300e-6:
        time.sleep(seconds - 150e-6)
    while time.perf_counter() < end:
        os.sched_yield()


class _Delayed:
    """A span (or no span) with a fixed sleep inside it: the slower link's extra time, recorded
    as part of the collective."""

    def __init__(self, inner, seconds: float):
        self.inner, self.seconds = inner, seconds

    def __enter__(self):
        out = self.inner.__enter__()
        pause(self.seconds)
        return out

    def __exit__(self, *exc):
        return self.inner.__exit__(*exc)


def span_name(axis: str, op: str, nbytes: int, dtype: torch.dtype, group: int, backend: str,
              splits: tuple[int, list[int], list[int]] | None = None) -> str:
    """`commprobe/comm/{axis}/{op}/bytes=N/dtype=T/group=G/backend=B`, parsed by the analyzers. An
    all-to-all adds who sends how much to whom: `/grank=R/send=B0.B1…/recv=B0.B1…`, this rank's
    place in its group and the bytes it sends to and receives from each group rank (the traffic
    matrix's row and column; analyzers/per_rank/traffic.py)."""
    t = str(dtype).removeprefix("torch.")
    name = f"{SPAN_PREFIX}/{axis}/{op}/bytes={nbytes}/dtype={t}/group={group}/backend={backend}"
    if splits is not None:
        grank, send, recv = splits
        name += f"/grank={grank}/send={'.'.join(map(str, send))}/recv={'.'.join(map(str, recv))}"
    return name


def profiling() -> bool:
    """Whether a torch profiler is recording. The one place that reads torch's module flag
    (private, but a plain bool: about 0.07 µs, where the public record_function costs 7 µs
    even with the profiler off); torch's C query as the fallback if the flag ever goes."""
    flag = getattr(_prof, "_is_profiler_enabled", None)
    return flag if flag is not None else torch.autograd._profiler_enabled()


def span(name: str):
    """A `record_function(name)` span while a profiler records, else a no-op context: phase
    markers, ring steps and collectives all open theirs through here."""
    return torch.profiler.record_function(name) if profiling() else _NULL


def comm_span(axis: str, op: str, x: torch.Tensor, group: int, backend: str,
              splits: tuple[int, list[int], list[int]] | None = None):
    """The collective's span; `splits` (group rank, rows sent to / received from each group rank)
    for an all-to-all, turned into bytes here (only while a profiler records)."""
    delay = LINK_DELAY_S.get(axis) if LINK_DELAY_S else None
    if not profiling():
        return _Delayed(_NULL, delay) if delay else _NULL
    if splits is not None:
        row = math.prod(x.shape[1:]) * x.element_size()  # a rank with no rows still receives
        splits = (splits[0], [int(n) * row for n in splits[1]], [int(n) * row for n in splits[2]])
    ctx = torch.profiler.record_function(span_name(axis, op, x.numel() * x.element_size(), x.dtype, group, backend,
                                                   splits))
    return _Delayed(ctx, delay) if delay else ctx
