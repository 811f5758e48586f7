"""The CI performance regression gate: metrics with repeated samples, a baseline, a decision.

Why this shape. A shared CI machine is noisy (on our 2-core host the same decode step varies by
tens of percent between runs), so a gate that compares two medians flaps. Each metric carries
its repeated samples, and a regression needs both:
- **a real shift**: the one-sided Mann-Whitney U test says the current samples are larger
  than the baseline's with p < alpha (rank-based: robust to the long right tail of latency);
- **a shift that matters**: the median moved by more than a minimum effect size, with separate
  thresholds for absolute times (a ratio, `--max-regression 10%`) and for shares of latency
  (percentage points, `--max-share-increase 5pp`): a 2 % share growing to 4 % doubles, but
  is not what a user cares about.

Fail closed: a metric the baseline has and the current run lacks, too few samples, another
schema, or a different workload (preset, layout, backend, sizes) is exit 2, never a pass. A
baseline recorded on other hardware is flagged in every output, since its times do not
transfer. So is a regression measured while other work contended for the host's cores (the
bundle's telemetry, readers/telemetry.host_contention): a CI job sharing its cores once read DDA's
TTIT +786 %, and a slower run there cannot be told from a busy host, so it is exit 2 with why,
not a regression; a pass on a contended host is kept, with a warning.

"A shift that matters" is judged on the bootstrap 95 % confidence interval of the median ratio
(times) or difference (shares): a regression needs even its low end past the threshold, so
six noisy samples whose median happens to land past the threshold do not fail a build, while
a real slowdown measured on enough samples does. Samples are not independent (decode steps
of one run share the machine's state), so p-values are optimistic; the interval and the
effect size are what keep the gate from flapping, and the thresholds for a given machine are
measured (see bench/RESULTS.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from commprobe.analyzers.cross_rank.cause import host_words
from commprobe.common.stats import bootstrap_ci, mann_whitney_greater

from .metrics import GateInputError, Metric, baseline_doc, host_contention, load_metrics, pooled_metrics

RESULT_SCHEMA = "commprobe.gate/1"
PASS, REGRESSION, UNUSABLE = 0, 1, 2
CONTEXT_KEYS = ("preset", "world", "backend", "batch", "prompt_len", "decode_steps")


@dataclass
class Thresholds:
    max_regression: float = 0.10  # time metrics: current median / baseline median - 1
    max_share_increase: float = 0.05  # share metrics: absolute increase (0.05 = 5 percentage points)
    alpha: float = 0.01
    min_samples: int = 5

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1 or self.min_samples < 2 or self.max_regression < 0 or self.max_share_increase < 0:
            raise GateInputError("--alpha must be in (0, 1), --min-samples >= 2, thresholds >= 0")


@dataclass
class MetricStatus:
    name: str
    kind: str
    unit: str
    status: str  # pass, regression, improvement, unusable
    baseline_median: float | None = None
    current_median: float | None = None
    change: float | None = None  # ratio - 1 for times, difference for shares
    ci95: list[float] | None = None  # bootstrap CI of the median ratio (times) or difference (shares)
    p_value: float | None = None
    n_baseline: int = 0
    n_current: int = 0
    why: str = ""


@dataclass
class GateResult:
    exit_code: int
    metrics: list[MetricStatus]
    problems: list[str] = field(default_factory=list)  # reasons for exit 2
    warnings: list[str] = field(default_factory=list)
    thresholds: Thresholds = field(default_factory=Thresholds)
    baseline_machine: dict = field(default_factory=dict)
    current_machine: dict = field(default_factory=dict)
    current_host: dict | None = None  # the current run's host contention, where it was contended

    def to_dict(self) -> dict:
        return {"schema": RESULT_SCHEMA, "exit_code": self.exit_code,
                "status": {PASS: "pass", REGRESSION: "regression", UNUSABLE: "unusable"}[self.exit_code],
                "problems": self.problems, "warnings": self.warnings, "thresholds": asdict(self.thresholds),
                "baseline_machine": self.baseline_machine, "current_machine": self.current_machine,
                "current_host": self.current_host, "metrics": [asdict(v) for v in self.metrics]}


def judge(name: str, base: Metric, cur: Metric, th: Thresholds) -> MetricStatus:
    v = MetricStatus(name, base.kind, base.unit, "pass", n_baseline=len(base.samples), n_current=len(cur.samples))
    if min(len(base.samples), len(cur.samples)) < th.min_samples:
        v.status = "unusable"
        v.why = (f"too few samples ({len(base.samples)} baseline, {len(cur.samples)} current; need {th.min_samples}): "
                 f"run with more --repeats")
        return v
    b, c = float(np.median(base.samples)), float(np.median(cur.samples))
    v.baseline_median, v.current_median = b, c
    v.ci95 = bootstrap_ci(cur.samples, base.samples, base.kind)
    if base.kind == "time":
        v.change = c / b - 1 if b > 0 else 0.0
        limit = th.max_regression
    else:
        v.change = c - b
        limit = th.max_share_increase
    p_worse = mann_whitney_greater(cur.samples, base.samples)
    p_better = mann_whitney_greater(base.samples, cur.samples)
    v.p_value = p_worse
    lo, hi = (v.ci95[0] - 1, v.ci95[1] - 1) if base.kind == "time" else tuple(v.ci95)
    if lo > limit and p_worse < th.alpha:
        v.status = "regression"
        v.why = (f"{_fmt_change(v)}, even the 95 % CI's low end {_fmt(base.kind, lo)} > {_fmt_limit(base.kind, limit)} "
                 f"(Mann-Whitney p = {p_worse:.2g})")
    elif hi < -limit and p_better < th.alpha:
        v.status = "improvement"
        v.p_value = p_better
        v.why = f"{_fmt_change(v)} (Mann-Whitney p = {p_better:.2g})"
    else:
        v.why = f"{_fmt_change(v)}, within {_fmt_limit(base.kind, limit)} or not significant (p = {p_worse:.2g})"
    return v


def _fmt(kind: str, x: float) -> str:
    return f"{x:+.1%}" if kind == "time" else f"{100 * x:+.1f} pp"


def _fmt_change(v: MetricStatus) -> str:
    return _fmt(v.kind, v.change)


def _fmt_limit(kind: str, limit: float) -> str:
    return f"+{limit:.0%}" if kind == "time" else f"+{100 * limit:.1f} pp"


def _select(names: list[str], patterns: list[str]) -> list[str]:
    import fnmatch

    if not patterns:
        return names
    return [n for n in names if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)]


def gate(baseline: str | Path, current: str | Path, metrics: list[str] = (), th: Thresholds | None = None) -> GateResult:
    th = th or Thresholds()
    base, bctx, bmach = load_metrics(baseline)
    cur, cctx, cmach = load_metrics(current)
    res = GateResult(PASS, [], thresholds=th, baseline_machine=bmach, current_machine=cmach)
    for k in CONTEXT_KEYS:
        if k in bctx and k in cctx and bctx[k] != cctx[k]:
            res.problems.append(f"different workload: {k} is {bctx[k]!r} in the baseline and {cctx[k]!r} now")
    differing = [k for k in bmach if k in cmach and bmach[k] != cmach[k] and bmach[k] is not None]
    if differing:
        res.warnings.append("baseline from another machine (" + ", ".join(
            f"{k}: {bmach[k]!r} vs {cmach[k]!r}" for k in differing) + "): times may not transfer")
    names = _select(sorted(base), list(metrics))
    for pat in metrics:
        if not _select(sorted(base), [pat]):
            res.problems.append(f"metric {pat!r} is not in the baseline")
    if not names and not res.problems:
        res.problems.append("no metrics to compare")
    for n in names:
        if n not in cur:
            res.metrics.append(MetricStatus(n, base[n].kind, base[n].unit, "unusable", n_baseline=len(base[n].samples),
                                        why="missing from the current run"))
            continue
        res.metrics.append(judge(n, base[n], cur[n], th))
    bad = [v for v in res.metrics if v.status == "unusable"]
    res.problems += [f"{v.name}: {v.why}" for v in bad]
    host = host_contention(current)
    if host and host.get("contended"):
        res.current_host = host
        busy = host_words(host, "the current run's ranks")
        regressed = [v.name for v in res.metrics if v.status == "regression"]
        if regressed:
            res.problems.append(f"{', '.join(regressed)} regressed, but {busy}: a slower run cannot be told from a "
                                f"contended host; run again with the host to itself")
        else:
            res.warnings.append(f"{busy}: the times may be slower than the code's")
    if res.problems:
        res.exit_code = UNUSABLE
    elif any(v.status == "regression" for v in res.metrics):
        res.exit_code = REGRESSION
    return res


@dataclass
class BaselineUpdate:
    """What `update_baseline` stored and what it left out, and why (for the user to read)."""
    path: str
    stored: int
    source: str
    left_out: list[str] = field(default_factory=list)  # one line per reason


def update_baseline(currents: list[str], baseline: str | Path, th: Thresholds | None = None) -> BaselineUpdate:
    """Pool several runs of one workload on one machine into a baseline file. A metric missing
    from some run, or with fewer than `min_samples` samples, is left out and named: gated later,
    it would rest on some runs only, or make every later gate unusable."""
    import json

    th = th or Thresholds()
    metrics, context, machine, missing = pooled_metrics(currents)
    notes = [f"left out (not in every run): {', '.join(missing)}"] if missing else []
    few = sorted(n for n, m in metrics.items() if len(m.samples) < th.min_samples)
    metrics = {n: m for n, m in metrics.items() if n not in few}
    if few:
        notes.append(f"left out (fewer than {th.min_samples} samples): {', '.join(few)}")
    source = " + ".join(currents)
    if not metrics:
        raise GateInputError(f"{source}: no metrics with at least {th.min_samples} samples to store")
    try:
        Path(baseline).write_text(json.dumps(baseline_doc(metrics, context, machine, source), indent=1) + "\n")
    except OSError as e:
        raise GateInputError(f"cannot write {baseline}: {e.strerror or e}") from None
    return BaselineUpdate(str(baseline), len(metrics), source, notes)


def gate_one(baseline: str | Path, currents: list[str], metrics: list[str] = (), th: Thresholds | None = None) -> GateResult:
    """The gate judges one run; several are pooled only into a baseline."""
    if len(currents) != 1:
        raise GateInputError("the gate judges one --current run (several are pooled only with --update-baseline)")
    return gate(baseline, currents[0], metrics, th)
