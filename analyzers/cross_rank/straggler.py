"""One rule for naming a straggler, shared by the collectives table (matching.py) and the
verdict's culprit (cause.py), so the table, the verdict and the JSON never name different ranks.

A rank is named only where it stands out: it caused at least STRAGGLER_SHARE of the waiting the
matched calls hold. Ranks that take turns arriving last (a third process time-sharing two
cores: 216 calls last each) cause about equal shares, and naming the one at 50.5 % against 49.5 %
would send an engineer after a rank that is no slower than its peer.
"""

from __future__ import annotations

STRAGGLER_SHARE = 0.75
RULE = f"a rank is named when it caused at least {STRAGGLER_SHARE:.0%} of the waiting"


def stands_out(caused: dict) -> tuple[object | None, object | None, float]:
    """(the rank named, or None; the rank that caused most; its share of the waiting) from each
    rank's caused waiting. No waiting: no rank."""
    total = sum(caused.values())
    if not total or total <= 0:
        return None, None, 0.0
    top = max(caused, key=lambda k: caused[k])
    share = caused[top] / total
    return (top if share >= STRAGGLER_SHARE else None), top, share
