"""Sizes and fractions as users type them and tables print them ('4K', '64M', '10%', '5pp')."""

from __future__ import annotations


def parse_size(text: str) -> int:
    """'4K' -> 4096, '64M' -> 67108864, '1G', plain bytes; binary units as nccl-tests uses."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in "KMG" else t
    try:
        value = int(float(num) * mult)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (use e.g. 4K, 64M)") from None
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return value


def human_size(n: int) -> str:
    for unit, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m}{unit}"
    return str(n)


def message_size(n: int) -> str:
    """A message size as people say it: bytes below a KiB (a tiny model's 512 B is not '0 KiB')."""
    return f"{n} B" if n < 1024 else f"{n / 1024:g} KiB" if n < 1 << 20 else f"{n / (1 << 20):g} MiB"


def parse_fraction(text: str, what: str, points: bool = False) -> float:
    """'10%' or '0.1' -> 0.1; with `points` also '5pp' -> 0.05 (percentage points of a share)."""
    t = text.strip().lower()
    try:
        if points and t.endswith("pp"):
            return float(t[:-2]) / 100
        if t.endswith("%"):
            return float(t[:-1]) / 100
        return float(t)
    except ValueError:
        raise ValueError(f"{what} must look like 10% or 0.1{' or 5pp' if points else ''}, got {text!r}") from None
