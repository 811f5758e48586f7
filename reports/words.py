"""Sentences both renderers (terminal and HTML) print the same way."""

from __future__ import annotations


def latency_words(lat: dict, metric: str, label: str, base: str = "A") -> str:
    """"dda 1.7x faster on TTIT (1.5-1.9x)", or "no difference beyond the noise", from
    analyzers/latency.compare's figures (B/A: `label` is B, `base` A)."""
    v = (lat or {}).get(metric)
    if not v:
        return f"{metric.upper()}: " + ((lat or {}).get("note") or "not measured on both sides")
    r, lo, hi = v["ratio"], v["low"], v["high"]
    if not v["beyond_noise"]:
        return (f"{metric.upper()}: no difference beyond the noise ({label}/{base} {r:.2f}x, 95 % interval "
                f"{lo:.2f}-{hi:.2f}x, {v['a_ms']:.3f} vs {v['b_ms']:.3f} ms)")
    if r < 1:
        return (f"{metric.upper()}: {label} {1 / r:.2f}x faster ({1 / hi:.2f}-{1 / lo:.2f}x, 95 %; "
                f"{v['a_ms']:.3f} -> {v['b_ms']:.3f} ms)")
    return (f"{metric.upper()}: {label} {r:.2f}x slower ({lo:.2f}-{hi:.2f}x, 95 %; "
            f"{v['a_ms']:.3f} -> {v['b_ms']:.3f} ms)")
