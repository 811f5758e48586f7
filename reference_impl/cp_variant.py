"""The pass-KV / pass-Q choice of context-parallel prefill, apart from torch so planners can use it.

Per ring step pass-KV moves 2 (T + P)/N x H_kv x d values (K and V of every cached and new
token, T cached, P new) and pass-Q moves P/N x H x d (queries of the new tokens). pass-Q
moves less when P x H < 2 (T + P) x H_kv, i.e. P / (T + P) < 2 H_kv / H.
"""

from __future__ import annotations

VARIANTS = ("auto", "pass-kv", "pass-q")


def choose_variant(cached: int, new: int, n_heads: int, n_kv_heads: int) -> str:
    """pass-Q when P / (T + P) < 2 * H_kv / H, else pass-KV (always on a cold cache)."""
    return "pass-q" if new * n_heads < 2 * (cached + new) * n_kv_heads else "pass-kv"
