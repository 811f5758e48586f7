"""One rank's collective calls, as arrays for the cross-rank step (cross_rank/matching.py).

One event stands for each collective call on a rank, from the best source the trace has: our
own spans, else the device's communication kernels, else the host's collective ops. Calls
are keyed for matching across ranks by (process group, op, sequence number) where the trace
records the group's sequence number (args "Seq", recent PyTorch), else by (process group, op,
n-th call).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from commprobe.common.vocab import AXIS_SOURCES, CATEGORIES

from ..readers.model import Trace, factorize
from .classify import Classified, comm_mask, is_own_span


@dataclass
class Calls:
    """One rank's collective calls as arrays, one row per call in start order.

    A call's match key is (pair, k): pair indexes `pairs` ((process group, op) strings), k is the
    call's sequence number in its group when the trace records one for every call of the pair,
    else its count among this rank's calls of that pair. `kinds` holds the distinct (op, axis,
    category, axis source: how the axis was decided)."""

    pairs: list[tuple[str, str]]
    pair: np.ndarray  # int64 into pairs
    k: np.ndarray  # int64
    start: np.ndarray  # µs
    end: np.ndarray
    bytes: np.ndarray
    kinds: list[tuple[str, str, str]]
    kind: np.ndarray  # int64 into kinds
    group_size: np.ndarray
    event: np.ndarray | None = None  # int64: each call's event in the rank's trace (per-rank steps only)

    def __len__(self) -> int:
        return len(self.start)

    def category(self) -> np.ndarray:
        """Per call: its category name (object array)."""
        return self._field(2)

    def op(self) -> np.ndarray:
        """Per call: its op name (object array)."""
        return self._field(0)

    def _field(self, i: int) -> np.ndarray:
        return np.array([k[i] for k in self.kinds] or [""], dtype=object)[self.kind] if len(self) else np.zeros(0, object)


def group_starts(sorted_keys: np.ndarray) -> np.ndarray:
    """Where each run of equal keys begins in a sorted array."""
    return np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]) if len(sorted_keys) else np.zeros(0, np.int64)


def primary_calls(trace: Trace, cls: Classified) -> Calls:
    comm = np.flatnonzero(comm_mask(cls.category))
    is_own = trace.events_named(comm, is_own_span)
    if is_own.any():
        pick = _outermost(trace, comm[is_own])  # a user's span around our own counts once
    else:
        dev = trace.is_device()[comm]
        has_op = cls.comm_op[comm].astype(bool)
        is_rpc = trace.events_named(comm, "record_param_comms".__eq__)
        host = comm[~dev & has_op & is_rpc]
        host = host if len(host) else comm[~dev & has_op]
        pick = comm[dev & has_op]
        if not len(pick):
            pick = _outermost(trace, host)
    pick = np.asarray(pick, np.int64)
    ops = [o or "unknown" for o in cls.comm_op[pick].tolist()]
    axes = cls.comm_axis[pick].tolist()
    groups = [g or a or "" for g, a in zip(cls.comm_group[pick].tolist(), axes)]
    pair, pairs = factorize(list(zip(groups, ops)))
    order = np.argsort(pair, kind="stable")  # k: the call's rank among this rank's calls of its pair
    k = np.empty(len(pick), np.int64)
    first = group_starts(pair[order])
    k[order] = np.arange(len(pick)) - np.repeat(first, np.diff(np.r_[first, len(pick)]))
    # A pair whose every call carries its process group's sequence number (args "Seq") is matched
    # by it: ranks whose traces start or end at different calls still pair the same collective.
    seq = cls.seq[pick]
    numbered = np.ones(len(pairs), bool)
    np.logical_and.at(numbered, pair, seq >= 0)
    k = np.where(numbered[pair], seq, k)
    cats = np.array(CATEGORIES, dtype=object)[cls.category[pick].astype(np.int64)].tolist()
    sources = np.array(AXIS_SOURCES, dtype=object)[cls.axis_source[pick].astype(np.int64)].tolist()
    kind, kinds = factorize(list(zip(ops, [a or "other" for a in axes], cats, [s or "unknown" for s in sources])))
    end = (trace.ts[pick] + trace.dur[pick]).astype(np.float64)
    if cls.call_end is not None:  # a c10d op's call runs on to the end of its wait or its work (blocking.py)
        end = np.fmax(end, cls.call_end[pick])
    return Calls(pairs, pair, k, trace.ts[pick].astype(np.float64), end,
                 cls.comm_bytes[pick].astype(np.float64), kinds, kind, cls.group_size[pick].astype(np.int64), pick)


def _outermost(trace: Trace, idx: np.ndarray) -> np.ndarray:
    """Host ops nest (c10d::allreduce_ inside record_param_comms...): keep the outermost per thread."""
    idx = np.asarray(idx, np.int64)
    if not len(idx):
        return idx
    idx = idx[np.lexsort((-trace.dur[idx], trace.ts[idx]))]
    out, last_end = [], {}
    for i, t, s, e in zip(idx.tolist(), trace.tid_id[idx].tolist(), trace.ts[idx].tolist(),
                          (trace.ts[idx] + trace.dur[idx]).tolist()):
        if s < last_end.get(t, -math.inf):
            continue
        out.append(i)
        last_end[t] = e
    return np.array(out, np.int64)
