"""The gate's metrics: repeated samples per metric, from a run bundle, an analysis or a baseline.

Timings come from the bundle (common.bundle); per-call collective latency and per-window
exposed share come from the analysis the analyzers give. The gate consumes these; it never
reads a trace itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from commprobe.common.bundle import (
    MANIFEST,
    machine_facts,
    per_sample,
    read_json,
    read_timings,
    require_manifest,
    run_context,
    sub_bundles,
    timing_samples,
)
from commprobe.common.errors import InputError
from commprobe.common.vocab import AXIS_OF

SCHEMA = "commprobe.baseline/1"


class GateInputError(InputError):
    """Unusable gate input: exit 2."""


@dataclass
class Metric:
    name: str
    kind: str  # "time" (lower is better, compared as a ratio) or "share" (compared in percentage points)
    unit: str
    samples: list[float]


def timing_metrics(timings: dict, prefix: str = "") -> dict[str, Metric]:
    """TTFT and TTIT (slowest rank per sample) and the blocked-communication share per phase
    and axis (mean over ranks), from a bundle's timings.json (common.bundle.timing_samples)."""
    out = {}
    for name, samples in timing_samples(timings).items():
        kind, unit = ("time", "ms") if name.endswith("_ms") else ("share", "fraction")
        out[prefix + name] = Metric(prefix + name, kind, unit, samples)
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
            axis = AXIS_OF.get(cat, "other")
            samples = per_sample([x[cat] for x in rows], lambda xs: sum(xs) / len(xs))
            if any(samples):
                name = f"{prefix}exposed_share/{phase}/{axis}"
                out[name] = Metric(name, "share", "fraction", samples)
    return out


def host_contention(path: str | Path) -> dict | None:
    """How contended the host was while a run bundle's ranks ran (the analyzers' reading of its
    telemetry, readers/telemetry.host_contention); None for anything else or without the counters."""
    p = Path(path)
    if not (p.is_dir() and (p / MANIFEST).is_file()):
        return None
    from commprobe.analyzers.analysis import host_of

    return host_of(p, require_manifest(p))


def load_metrics(path: str | Path, analyze_traces: bool = True) -> tuple[dict[str, Metric], dict, dict]:
    """(metrics, run context, machine facts) of a run bundle, an analysis JSON, or a baseline."""
    p = Path(path)
    if p.is_dir():
        manifest = require_manifest(p)
        subs = sub_bundles(manifest)
        metrics: dict[str, Metric] = {}
        dirs = {f"{b}/": p / d for b, d in subs.items()} if subs else {"": p}
        for prefix, d in dirs.items():
            metrics.update(timing_metrics(read_timings(d), prefix))
            if analyze_traces and any(d.glob("rank*.trace.json*")):
                from commprobe.analyzers.analysis import analyze

                result = analyze(str(d))
                metrics.update(collective_metrics(result, prefix))
                metrics.update(exposure_metrics(result, prefix))
        return metrics, run_context(manifest), machine_facts(manifest)
    data = read_json(p)
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


def pooled_metrics(paths: list[str]) -> tuple[dict[str, Metric], dict, dict, list[str]]:
    """Several runs of one workload on one machine as one sample set per metric, for a baseline:
    on a shared machine whole runs land in a fast or a slow mode (separate runs of unchanged code
    differ by up to ~2x here), and a baseline pooled over several sits between the modes instead
    of in one. (metrics, context, machine, names left out because a run lacks them.)"""
    runs = [(p, *load_metrics(p)) for p in paths]
    first, _, context, machine = runs[0]
    for p, metrics, ctx, mach in runs[1:]:
        if ctx != context:
            raise GateInputError(f"{p}: another workload than {first} ({ctx} vs {context}); a baseline pools runs of one")
        if mach != machine:
            raise GateInputError(f"{p}: another machine than {first} ({mach} vs {machine}); a baseline pools runs of one")
    names = set.intersection(*(set(m) for _, m, _, _ in runs))
    left_out = sorted(set.union(*(set(m) for _, m, _, _ in runs)) - names)
    pooled = {}
    for n in sorted(names):
        kinds = {(m[n].kind, m[n].unit) for _, m, _, _ in runs}
        if len(kinds) > 1:
            raise GateInputError(f"metric {n!r} is measured differently across the runs: {sorted(kinds)}")
        first_metric = runs[0][1][n]
        pooled[n] = Metric(n, first_metric.kind, first_metric.unit, [x for _, m, _, _ in runs for x in m[n].samples])
    return pooled, context, machine, left_out


def baseline_doc(metrics: dict[str, Metric], context: dict, machine: dict, source: str) -> dict:
    return {"schema": SCHEMA, "source": source, "context": context, "machine": machine,
            "metrics": {n: {"kind": m.kind, "unit": m.unit, "samples": m.samples} for n, m in sorted(metrics.items())}}
