"""Two runs' un-profiled TTFT and TTIT against each other, and whether the difference is beyond
the runs' own noise (issue 58, item 4): what `compare` and the two-backend report say first.

A bundle records every repetition's TTFT and each decode step's time (timings.json, the slowest
rank per sample). B/A is the ratio of the medians; its interval is the gate's bootstrap
(common/stats.py), resampling whole repetitions, since the steps of one repetition share its
spell of the machine. Beyond the noise where the interval excludes 1. On this 2-core machine the
same backend's runs spread 7-116 % between launches: a ranking from one pair of runs flips, and
the interval is what says so.
"""

from __future__ import annotations

from pathlib import Path
from statistics import median

from commprobe.common.bundle import BundleError, read_timings, timing_samples
from commprobe.common.stats import bootstrap_ci

from .readers import remote

MIN_REPEATS = 3
RULE = ("B/A of the un-profiled medians (the slowest rank per sample); 95 % bootstrap interval resampling whole "
        "repetitions; beyond the noise where the interval excludes 1. It holds the repetitions' noise, not the drift "
        "between launches: two runs launched apart (not one `profile --backend A,B`) can differ more")


def _samples(path) -> dict[str, list[float]] | None:
    if path is None or remote.is_url(str(path)) or not (Path(path) / "timings.json").is_file():
        return None
    try:
        return timing_samples(read_timings(Path(path)))
    except (BundleError, ValueError, TypeError, KeyError):
        return None


def compare(a_path, b_path) -> dict:
    """Per metric (ttft, ttit): A's and B's medians (ms), B/A, its interval and whether it is beyond
    the noise; or why it cannot be told."""
    sa, sb = _samples(a_path), _samples(b_path)
    if sa is None or sb is None:
        return {"rule": RULE, "note": "the runs' noise cannot be told: no repeated un-profiled timings on both "
                                      "sides (a commprobe bundle records them)"}
    ra, rb = len(sa["ttft_ms"]), len(sb["ttft_ms"])
    if min(ra, rb) < MIN_REPEATS:
        return {"rule": RULE, "note": f"the runs' noise cannot be told from {min(ra, rb)} repetition(s); "
                                      f"{MIN_REPEATS} or more per run (`profile --repeats`) measure it"}
    out: dict = {"rule": RULE, "repeats": [ra, rb]}
    for m in ("ttft", "ttit"):
        x, y = sa[f"{m}_ms"], sb[f"{m}_ms"]
        if not x or not y or median(x) <= 0:
            continue
        lo, hi = bootstrap_ci(y, x, "time", blocks=(rb, ra))
        out[m] = {"a_ms": median(x), "b_ms": median(y), "ratio": median(y) / median(x), "low": lo, "high": hi,
                  "beyond_noise": not lo <= 1.0 <= hi}
    return out


__all__ = ["compare", "RULE"]
