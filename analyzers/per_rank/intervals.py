"""Interval arithmetic on numpy arrays: union, difference, intersection with windows.

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
