"""The statistics the gate and `compare` share: a rank test for a real shift and a bootstrap
interval for its size, so a regression and a "faster" are told from the noise by one rule.

Hand-written (about 40 lines with numpy) rather than scipy: scipy would be the only reason
to install a 40 MB package, and the normal approximation with tie and continuity
corrections is what scipy.stats.mannwhitneyu(method="asymptotic") computes.
"""

from __future__ import annotations

import math

import numpy as np


def _ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their average rank."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    xs = x[order]
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def mann_whitney_greater(current: list[float], baseline: list[float]) -> float:
    """One-sided p-value that `current` tends to be larger than `baseline` (normal approximation
    with tie and continuity corrections; fine from about 5 samples a side)."""
    x, y = np.asarray(current, float), np.asarray(baseline, float)
    n1, n2 = len(x), len(y)
    n = n1 + n2
    r = _ranks(np.concatenate([x, y]))
    u = r[:n1].sum() - n1 * (n1 + 1) / 2
    _, counts = np.unique(np.concatenate([x, y]), return_counts=True)
    tie = float((counts ** 3 - counts).sum())
    var = n1 * n2 / 12 * ((n + 1) - tie / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (u - n1 * n2 / 2 - 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2))


def bootstrap_ci(current: list[float], baseline: list[float], kind: str, n: int = 2000, seed: int = 0,
                 blocks: tuple[int, int] | None = None) -> list[float]:
    """95 % percentile-bootstrap interval of median(current)/median(baseline) (times) or their
    difference (shares). `blocks` (current's, baseline's): the samples are that many equal runs of
    consecutive samples (a bundle's repetitions, each of its decode steps), resampled whole: steps
    of one repetition share its spell of the machine, so resampling them one by one narrows the
    interval beyond what the runs support."""
    rng = np.random.default_rng(seed)
    x, y = np.asarray(current, float), np.asarray(baseline, float)
    mx = np.median(_resample(x, rng, n, blocks[0] if blocks else 0), axis=1)
    my = np.median(_resample(y, rng, n, blocks[1] if blocks else 0), axis=1)
    stat = mx / np.where(my > 0, my, np.nan) if kind == "time" else mx - my
    lo, hi = np.nanpercentile(stat, [2.5, 97.5])
    return [float(lo), float(hi)]


def _resample(x: np.ndarray, rng: np.random.Generator, n: int, blocks: int) -> np.ndarray:
    """n bootstrap resamples of x (rows), by sample or by whole block where x splits evenly."""
    if blocks > 1 and len(x) % blocks == 0:
        b = x.reshape(blocks, -1)
        return b[rng.integers(0, blocks, (n, blocks))].reshape(n, -1)
    return x[rng.integers(0, len(x), (n, len(x)))]
