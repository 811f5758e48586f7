"""Bounding what a result keeps of a long series (the regression gate's samples)."""

from __future__ import annotations

import numpy as np


def thin(x: np.ndarray, k: int, digits: int) -> list[float]:
    """At most k of the samples, evenly spaced in order (keeps drift visible, bounds the JSON)."""
    if len(x) > k:
        x = x[np.linspace(0, len(x) - 1, k).round().astype(int)]
    return [round(float(v), digits) for v in x]
