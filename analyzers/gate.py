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
transfer.

"A shift that matters" is judged on the bootstrap 95 % confidence interval of the median ratio
(times) or difference (shares): a regression needs even its low end past the threshold, so
six noisy samples whose median happens to land past the threshold do not fail a build, while
a real slowdown measured on enough samples does. Samples are not independent (decode steps
of one run share the machine's state), so p-values are optimistic; the interval and the
effect size are what keep the gate from flapping, and the thresholds for a given machine are
measured (see bench/RESULTS.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .trace import TraceError

SCHEMA = "commprobe.baseline/1"
RESULT_SCHEMA = "commprobe.gate/1"
PASS, REGRESSION, UNUSABLE = 0, 1, 2
CONTEXT_KEYS = ("preset", "world", "backend", "batch", "prompt_len", "decode_steps")


class GateInputError(TraceError):
    """Unusable gate input: exit 2."""


@dataclass
class Metric:
    name: str
    kind: str  # "time" (lower is better, compared as a ratio) or "share" (compared in percentage points)
    unit: str
    samples: list[float]


@dataclass
class Thresholds:
    max_regression: float = 0.10  # time metrics: current median / baseline median - 1
    max_share_increase: float = 0.05  # share metrics: absolute increase (0.05 = 5 percentage points)
    alpha: float = 0.01
    min_samples: int = 5


@dataclass
class Verdict:
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
    verdicts: list[Verdict]
    problems: list[str] = field(default_factory=list)  # reasons for exit 2
    warnings: list[str] = field(default_factory=list)
    thresholds: Thresholds = field(default_factory=Thresholds)
    baseline_machine: dict = field(default_factory=dict)
    current_machine: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"schema": RESULT_SCHEMA, "exit_code": self.exit_code,
                "status": {PASS: "pass", REGRESSION: "regression", UNUSABLE: "unusable"}[self.exit_code],
                "problems": self.problems, "warnings": self.warnings, "thresholds": asdict(self.thresholds),
                "baseline_machine": self.baseline_machine, "current_machine": self.current_machine,
                "metrics": [asdict(v) for v in self.verdicts]}


# ---- statistics ----

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


def bootstrap_ci(current: list[float], baseline: list[float], kind: str, n: int = 2000, seed: int = 0) -> list[float]:
    """95 % percentile-bootstrap interval of median(current)/median(baseline) (times) or their difference (shares)."""
    rng = np.random.default_rng(seed)
    x, y = np.asarray(current, float), np.asarray(baseline, float)
    mx = np.median(x[rng.integers(0, len(x), (n, len(x)))], axis=1)
    my = np.median(y[rng.integers(0, len(y), (n, len(y)))], axis=1)
    stat = mx / np.where(my > 0, my, np.nan) if kind == "time" else mx - my
    lo, hi = np.nanpercentile(stat, [2.5, 97.5])
    return [float(lo), float(hi)]


def judge(name: str, base: Metric, cur: Metric, th: Thresholds) -> Verdict:
    v = Verdict(name, base.kind, base.unit, "pass", n_baseline=len(base.samples), n_current=len(cur.samples))
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


def _fmt_change(v: Verdict) -> str:
    return _fmt(v.kind, v.change)


def _fmt_limit(kind: str, limit: float) -> str:
    return f"+{limit:.0%}" if kind == "time" else f"+{100 * limit:.1f} pp"


# ---- metrics from a run bundle or an analysis ----

def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise GateInputError(f"{path}: cannot read ({e.strerror or e})") from None
    except ValueError as e:
        raise GateInputError(f"{path}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise GateInputError(f"{path}: expected a JSON object")
    return data


def machine_facts(manifest: dict) -> dict:
    """What makes times comparable: the hardware and software, not the host name."""
    dev = manifest.get("device") or {}
    return {"kind": dev.get("kind"), "processor": dev.get("processor"), "cpu_count": dev.get("cpu_count"),
            "gpu": dev.get("name"), "gpu_count": dev.get("count"), "torch": manifest.get("torch_version"),
            "os": (manifest.get("platform") or "").split("-")[0] or None, "arch": dev.get("machine")}


def run_context(manifest: dict) -> dict:
    run, world = manifest.get("run") or {}, manifest.get("world") or {}
    return {"preset": (manifest.get("model") or {}).get("name"),
            "world": {k: world.get(k) for k in ("size", "tp", "cp", "ep")},
            "backend": manifest.get("backend"), "batch": run.get("batch"),
            "prompt_len": run.get("prompt_len"), "decode_steps": run.get("decode_steps")}


def _per_sample(rows: list[list[float]], how) -> list[float]:
    """Combine ranks sample by sample (ranks record the same repetitions and steps)."""
    n = min((len(r) for r in rows), default=0)
    return [how([r[i] for r in rows]) for i in range(n)]


def timing_metrics(timings: dict, prefix: str = "") -> dict[str, Metric]:
    """TTFT and TTIT (slowest rank per sample: a token is ready when every rank is done) and
    the blocked-communication share per phase and axis (mean over ranks)."""
    ranks = timings.get("ranks") or []
    samples = [r.get("samples") or {} for r in ranks]
    if not samples or not all("ttit_s" in s and "ttft_s" in s for s in samples):
        raise GateInputError("timings.json has no per-rank ttft_s/ttit_s samples")
    out = {
        f"{prefix}ttft_ms": Metric(f"{prefix}ttft_ms", "time", "ms",
                                   [1e3 * x for x in _per_sample([s["ttft_s"] for s in samples], max)]),
        f"{prefix}ttit_ms": Metric(f"{prefix}ttit_ms", "time", "ms",
                                   [1e3 * x for x in _per_sample([s["ttit_s"] for s in samples], max)]),
    }
    for phase, key, total in (("prefill", "prefill_comm_s", "ttft_s"), ("decode", "decode_comm_s", "ttit_s")):
        axes = set.intersection(*(set(s.get(key) or {}) for s in samples)) if samples else set()
        for axis in sorted(axes):
            shares = [[c / t if t > 0 else 0.0 for c, t in zip(s[key][axis], s[total])] for s in samples]
            name = f"{prefix}{phase}_comm_share/{axis}"
            out[name] = Metric(name, "share", "fraction", _per_sample(shares, lambda xs: sum(xs) / len(xs)))
    return out


def collective_metrics(analysis: dict, prefix: str = "") -> dict[str, Metric]:
    """Collective latency per (op, axis, size bucket), from the analyzer's per-call samples."""
    out = {}
    for b in analysis.get("message_sizes") or []:
        samples = b.get("samples_us")
        if not samples:
            continue
        name = f"{prefix}collective_us/{b['op']}/{b['axis']}/{b['bucket_bytes']}B"
        out[name] = Metric(name, "time", "us", [float(x) for x in samples])
    return out


def exposure_metrics(analysis: dict, prefix: str = "") -> dict[str, Metric]:
    """Exposed communication share per phase and axis from the traces, one sample per window
    (mean over ranks): on a GPU this is the exposure that counts (kernels not overlapped by
    compute), where the ranks' blocked host time does not see asynchronous NCCL."""
    out = {}
    phases = {ph for r in analysis.get("ranks") or [] for ph in r.get("phases", {})}
    for phase in sorted(phases):
        rows = [r["phases"][phase].get("window_exposed_share") or {} for r in analysis["ranks"] if phase in r["phases"]]
        for cat in sorted(set.intersection(*(set(x) for x in rows)) if rows else set()):
            axis = {"tp_allreduce": "tp", "cp_ring": "cp", "ep_all_to_all": "ep"}.get(cat, "other")
            samples = _per_sample([x[cat] for x in rows], lambda xs: sum(xs) / len(xs))
            if any(samples):
                name = f"{prefix}exposed_share/{phase}/{axis}"
                out[name] = Metric(name, "share", "fraction", samples)
    return out


def load_metrics(path: str | Path, analyze_traces: bool = True) -> tuple[dict[str, Metric], dict, dict]:
    """(metrics, run context, machine facts) of a run bundle, an analysis JSON, or a baseline."""
    p = Path(path)
    if p.is_dir():
        mpath = p / "manifest.json"
        if not mpath.exists():
            raise GateInputError(f"{p}: not a run bundle (no manifest.json)")
        manifest = _read_json(mpath)
        if not str(manifest.get("schema", "")).startswith("commprobe.bundle/"):
            raise GateInputError(f"{mpath}: schema {manifest.get('schema')!r} is not a commprobe bundle")
        if manifest.get("status") not in ("ok", None):
            raise GateInputError(f"{p}: the run did not finish ({manifest.get('status')}: {manifest.get('error')})")
        subs = manifest.get("sub_bundles") or {}
        metrics: dict[str, Metric] = {}
        dirs = {f"{b}/": p / d for b, d in subs.items()} if subs else {"": p}
        for prefix, d in dirs.items():
            tpath = d / "timings.json"
            if not tpath.exists():
                raise GateInputError(f"{d}: no timings.json in the bundle")
            metrics.update(timing_metrics(_read_json(tpath), prefix))
            if analyze_traces and any(d.glob("rank*.trace.json*")):
                from .analysis import analyze

                result = analyze(str(d))
                metrics.update(collective_metrics(result, prefix))
                metrics.update(exposure_metrics(result, prefix))
        return metrics, run_context(manifest), machine_facts(manifest)
    data = _read_json(p)
    schema = str(data.get("schema", ""))
    if schema == SCHEMA:
        metrics = {}
        for name, m in (data.get("metrics") or {}).items():
            if not isinstance(m, dict) or m.get("kind") not in ("time", "share") or not isinstance(m.get("samples"), list):
                raise GateInputError(f"{p}: metric {name!r} is malformed")
            metrics[name] = Metric(name, m["kind"], m.get("unit", ""), [float(x) for x in m["samples"]])
        return metrics, data.get("context") or {}, data.get("machine") or {}
    if schema.startswith("commprobe.analysis/"):
        manifest = data.get("manifest") or {}
        return {**collective_metrics(data), **exposure_metrics(data)}, run_context(manifest), machine_facts(manifest)
    if schema.startswith("commprobe."):
        raise GateInputError(f"{p}: schema {schema!r} cannot be gated (expected a bundle, an analysis or {SCHEMA})")
    raise GateInputError(f"{p}: not a commprobe bundle, analysis or baseline (schema {schema or 'missing'})")


def baseline_doc(metrics: dict[str, Metric], context: dict, machine: dict, source: str) -> dict:
    return {"schema": SCHEMA, "source": source, "context": context, "machine": machine,
            "metrics": {n: {"kind": m.kind, "unit": m.unit, "samples": m.samples} for n, m in sorted(metrics.items())}}


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
            res.verdicts.append(Verdict(n, base[n].kind, base[n].unit, "unusable", n_baseline=len(base[n].samples),
                                        why="missing from the current run"))
            continue
        res.verdicts.append(judge(n, base[n], cur[n], th))
    bad = [v for v in res.verdicts if v.status == "unusable"]
    res.problems += [f"{v.name}: {v.why}" for v in bad]
    if res.problems:
        res.exit_code = UNUSABLE
    elif any(v.status == "regression" for v in res.verdicts):
        res.exit_code = REGRESSION
    return res
