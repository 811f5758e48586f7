"""Interval arithmetic on numpy arrays: union, difference, intersection with windows, and the
innermost of nested intervals that holds a point (a launch's host op, a launch's step).

An interval set is a pair of sorted, non-overlapping arrays (starts, ends). Every function
is vectorized: a million kernels cost a sort and a few passes, not a Python loop.
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]
EMPTY: Intervals = (np.zeros(0), np.zeros(0))


def union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    if len(starts) == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    # A new block starts where an interval begins after everything before it has ended.
    new = np.empty(len(s), bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    block_end = np.append(idx[1:], len(s)) - 1
    return s[idx], run_end[block_end]


def length(iv: Intervals) -> float:
    return float(np.sum(iv[1] - iv[0]))


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two interval sets (each already a union)."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return EMPTY
    # Sweep over all boundaries: covered by both where the depth reaches 2.
    pts = np.concatenate([a[0], a[1], b[0], b[1]])
    delta = np.concatenate([np.ones(len(a[0])), -np.ones(len(a[1])), np.ones(len(b[0])), -np.ones(len(b[1]))])
    order = np.lexsort((delta, pts))  # at equal points, ends (-1) before starts (+1)
    pts, depth = pts[order], np.cumsum(delta[order])
    inside = depth == 2
    starts = pts[:-1][inside[:-1]]
    ends = pts[1:][inside[:-1]]
    keep = ends > starts
    return starts[keep], ends[keep]


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """Parts of `a` not covered by `b` (both unions)."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return a
    pts = np.concatenate([a[0], a[1], b[0], b[1]])
    da = np.concatenate([np.ones(len(a[0])), -np.ones(len(a[1])), np.zeros(len(b[0]) * 2)])
    db = np.concatenate([np.zeros(len(a[0]) * 2), np.ones(len(b[0])), -np.ones(len(b[1]))])
    order = np.lexsort((da + db, pts))
    pts, ina, inb = pts[order], np.cumsum(da[order]), np.cumsum(db[order])
    seg = (ina[:-1] > 0) & (inb[:-1] == 0)
    starts, ends = pts[:-1][seg], pts[1:][seg]
    keep = ends > starts
    return union(starts[keep], ends[keep]) if keep.any() else EMPTY


def clip(iv: Intervals, lo: float, hi: float) -> Intervals:
    s, e = np.maximum(iv[0], lo), np.minimum(iv[1], hi)
    keep = e > s
    return s[keep], e[keep]


def covered(iv: Intervals, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Length of `iv` inside each window [lo[i], hi[i]], for many windows at once.

    F(x), the covered length up to x, is a prefix sum plus one partial interval, found by binary
    search; a window's share is F(hi) - F(lo). Cost: O((n + w) log n), not O(n * w).
    """
    s, e = iv
    if len(s) == 0:
        return np.zeros(len(lo))
    cum = np.concatenate([[0.0], np.cumsum(e - s)])

    def upto(x: np.ndarray) -> np.ndarray:
        k = np.searchsorted(s, x, side="right")  # intervals starting at or before x
        j = np.maximum(k - 1, 0)
        partial = np.clip(np.minimum(x, e[j]) - s[j], 0.0, None)
        return np.where(k > 0, cum[j] + partial, 0.0)

    return upto(np.asarray(hi, float)) - upto(np.asarray(lo, float))


def thread_keys(*pairs: tuple[np.ndarray, np.ndarray]) -> list[np.ndarray]:
    """(thread, time) pairs of arrays on one sorted axis, threads apart (thread x span + time): an
    earlier thread's keys all lie below a later thread's, so one sorted search covers every thread."""
    lo = min(float(np.min(t)) for _, t in pairs)
    span = max(float(np.max(t)) for _, t in pairs) - lo + 1.0
    return [tid * span + (t - lo) for tid, t in pairs]


def furthest_so_far(ke: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Over intervals sorted by start: the largest end up to each position, and where it is."""
    run = np.maximum.accumulate(ke)
    return run, np.maximum.accumulate(np.where(ke == run, np.arange(len(ke)), 0))


def enclosing(tid: np.ndarray, start: np.ndarray, end: np.ndarray, q_tid: np.ndarray, q_t: np.ndarray,
               ok: np.ndarray | None = None) -> np.ndarray:
    """For each query (thread, time): the index of the innermost interval on that thread that
    holds the time (-1: none), preferring intervals where `ok` holds; intervals may nest."""
    out = np.full(len(q_t), -1, np.int64)
    if not len(start) or not len(q_t):
        return out
    key_s, key_e, key_q = thread_keys((tid, start), (tid, end), (q_tid, q_t))
    order = np.argsort(key_s, kind="stable")
    ks, ke = key_s[order], key_e[order]
    j = np.searchsorted(ks, key_q, side="right") - 1  # the latest-starting interval at or before t
    has = j >= 0
    jj = np.maximum(j, 0)
    inner = has & (ke[jj] >= key_q)
    if ok is not None:
        inner &= ok[order][jj]
    out[inner] = order[jj[inner]]
    # Otherwise an earlier, longer interval may still hold t: the one with the largest end so far
    # (threads cannot mix: an earlier thread's keys all lie below this thread's).
    run, at = furthest_so_far(np.where(ok[order], ke, -np.inf) if ok is not None else ke)
    outer = has & ~inner & (run[jj] >= key_q)
    out[outer] = order[at[jj[outer]]]
    return out
