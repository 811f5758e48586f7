"""The cross-rank *reduce* of an analysis: every rank's summary (per_rank/) onto one clock, the
collectives matched across ranks (matching.py), the waits split by phase and category (cause.py,
headroom.py), the straggler named (straggler.py), the verdicts (verdict.py) and, with a
calibration, what switching backends would save. analysis.py, the facade, maps the ranks and
calls this once; a trace export (perfetto.py) and the invariants read the per-call facts it keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from commprobe.common.bundle import job_of
from commprobe.common.vocab import COMM_CATS

from . import cause, headroom, matching
from .straggler import stands_out
from .verdict import phase_summary


@dataclass
class Reduced:
    """What the reduce found: the result's cross-rank parts, and per rank its calls on the run's
    clock with their per-call facts (waits: wait, transfer, last arriver, held, carried; with a
    calibration each call's cost and every backend's calibrated time, the conditions' offset)."""

    origin: int
    matched: dict
    buckets: list
    provenance: dict
    axes: dict
    phases: dict
    room: dict | None
    calls: dict
    waits: dict
    costs: dict = field(default_factory=dict)
    targets: dict = field(default_factory=dict)
    offset: dict = field(default_factory=dict)
    own: str | None = None
    traffic: dict = field(default_factory=dict)  # per phase, each all-to-all call's imbalance (traffic.attach)
    instances: dict = field(default_factory=dict)  # per rank, our spans' axis -> its group instance (group_instances)


AXES = ("tp", "cp", "ep")  # our own spans name their group by the axis (per_rank/classify.py)


def group_instances(calls: dict, manifest: dict | None) -> dict[int, dict[str, str]]:
    """Per rank, the group our own spans name by its axis ("tp") -> the group instance it is ("tp
    [0, 1]"), from the bundle's layout, where the axis has several groups (a TP x EP job's TP pairs):
    without it their calls would share keys across groups that never meet. Renames `calls`' pairs."""
    layout = ((manifest or {}).get("world") or {}).get("layout") if isinstance(manifest, dict) else None
    world = len(layout) if isinstance(layout, list) else 0
    out: dict[int, dict[str, str]] = {}
    for row in layout if isinstance(layout, list) else []:
        r = row.get("rank") if isinstance(row, dict) else None
        if r not in calls:
            continue
        names = {a: f"{a} {sorted(g)}" for a in AXES if isinstance(g := row.get(f"{a}_group"), list)
                 and 1 < len(g) < world and all(isinstance(x, int) for x in g)}
        if names:
            out[r] = names
            calls[r].pairs = [(names.get(g, g), op) for g, op in calls[r].pairs]
    return out


def renamed_traffic(traffic: dict[int, dict], instances: dict[int, dict[str, str]]) -> dict[int, dict]:
    """Each rank's all-to-all traffic (per_rank/traffic.py: phase -> group -> rows) under the group
    instances group_instances named its calls, so the rows and the calls' times meet."""
    return {r: {ph: {instances.get(r, {}).get(g, g): v for g, v in groups.items()} for ph, groups in t.items()}
            for r, t in traffic.items()}


def reduce_ranks(ranks: list[dict], calls: dict, origins: dict, graphs: dict, *, align: str, threshold: float,
                 sweep: list[dict] | None, manifest: dict | None, cal_source: str | None,
                 host: dict | None = None) -> Reduced:
    """One clock, matching, waits per phase, straggler, verdicts and headroom, over every rank.
    `host`: how contended the host was while the ranks ran (readers/telemetry.host_contention)."""
    origin = min(origins.values())
    for r, cs in calls.items():  # one clock for the run: the earliest rank's base
        shift = (origins[r] - origin) / 1000.0
        cs.start += shift
        cs.end += shift
    for rk in ranks:  # windows and timelines on the run's clock too (µs since `origin_ns`)
        shift = (origins[rk["rank"]] - origin) / 1000.0
        rk["windows"] = {ph: [[a + shift, b + shift] for a, b in sp] for ph, sp in rk["windows"].items()}
        for seg in rk["segments"].values():
            seg["start_us"] += shift
    instances = group_instances(calls, manifest)
    offsets = matching.align_offsets(calls) if align == "collective-end" else None
    rule, why = matching.arrival_rule(calls, {rk["rank"]: rk["identity"].get("host") for rk in ranks}, offsets)
    matched = matching.match(calls, offsets, rule)
    matched["arrival_rule_why"] = why
    waits = matched.pop("_waits")
    baselines, floors, baseline = cause.call_baselines(calls, waits, sweep, manifest)
    own = cause.backend_of(manifest, []) if sweep else None  # the run's own, never guessed from the calibration
    costs = {r: matching.cost(c, waits[r]) for r, c in calls.items() if r in waits}
    tgt = {r: headroom.targets(c, sweep, len(calls)) for r, c in calls.items()} if sweep else {}
    offset, raw_offset = headroom.conditions(calls, waits, costs, tgt, own)
    _phase_waits(ranks, calls, waits, baselines, floors, costs, tgt, offset)
    _name_straggler(matched, ranks)
    buckets = matching.size_buckets(calls, waits)
    provenance = _provenance(calls)
    axes = _provenance(calls, field=1)
    phases = phase_summary(ranks, threshold, matched, buckets, provenance, graphs, axes, baseline,
                           {"host": host, "backend": cause.backend_of(manifest, [])})
    room = None
    if sweep:
        outside = headroom.median_per_run(sweep, "outside_us_per_window")
        job = job_of(manifest)  # only runs of this job lend their profiler share (whatif.py)
        total = sum(len(c) for c in calls.values())
        lone = total - matched["matched_calls"] * len(calls)  # one rank's trace: none matched
        same = [r for r in sweep if job is not None and r.get("job") == job]
        room = headroom.summary(ranks, sorted({r["backend"] for r in sweep}), own, offset, raw_offset, cal_source,
                                outside, (lone, total), headroom.median_per_run(same, "unprofiled_ratio"),
                                headroom.values_per_run(same, "unprofiled_ms"))
        room["collectives"] = headroom.collectives(calls, costs, tgt, offset)
        for ph, p in phases.items():
            line = headroom.advice(room, ph)
            if line:
                p["recommendations"].insert(0, line)
    return Reduced(origin, matched, buckets, provenance, axes, phases, room, calls, waits, costs, tgt, offset, own,
                   instances=instances)


def _provenance(calls: dict, field: int = 3) -> dict[str, dict[str, int]]:
    """Per communication category, how many calls had their axis declared, inferred or unknown
    (`field` 1: how many were on each axis)."""
    out: dict[str, dict[str, int]] = {}
    for c in calls.values():
        if not len(c):
            continue
        counts = np.bincount(c.kind, minlength=len(c.kinds))
        for kind, n in zip(c.kinds, counts.tolist()):
            if n:
                out.setdefault(kind[2], {}).setdefault(kind[field], 0)
                out[kind[2]][kind[field]] += n
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def _name_straggler(matched: dict, ranks: list[dict]) -> None:
    """The straggler by the verdict's own rule and scope (cross_rank/straggler.py): the waiting the
    calls inside the phases' windows hold, per rank that caused it. Calls outside every window (an
    engine's start-up broadcast where one rank waited 100 ms for another's load) are not the steps
    a verdict reads, so they name no straggler; the table's rows still count every matched call."""
    if not matched["matched_calls"]:
        return
    caused: dict[int, float] = {}
    squares: dict[int, float] = {}
    calls = 0
    for rk in ranks:
        for p in rk["phases"].values():
            for acc in (p.get("comm_calls") or {}).values():
                calls += acc["matched"]
                for who, us in acc["wait_by_last"].items():
                    caused[int(who)] = caused.get(int(who), 0.0) + us
                for who, us2 in (acc.get("wait_by_last_sq") or {}).items():
                    squares[int(who)] = squares.get(int(who), 0.0) + us2
    standing = stands_out(caused, squares, calls)
    matched["straggler"] = standing.name
    matched["straggler_rule"] = {**standing.rule(), "scope": "the matched calls inside the phases' windows"}


def _phase_waits(ranks: list[dict], calls: dict, waits: dict, baselines: dict | None = None,
                 floors: dict | None = None, costs: dict | None = None, targets: dict | None = None,
                 offset: dict | None = None) -> None:
    """Per rank, phase and communication category: `exposed_wait_us`, the part of the exposed time
    spent waiting for a straggler (matched calls that start in the phase's windows; on a host
    timeline all of a collective's time is exposed, on a device the wait is capped by the
    category's exposed time); `comm_calls`, the calls behind it (cross_rank/cause.py); and
    `switch_calls`, their cost per op and what each calibrated backend would save (headroom.py)."""
    for rk in ranks:
        r = rk["rank"]
        rc = calls.get(r)
        known = rc is not None and len(rc) and r in waits
        if known:  # per rank, once: each call's category, op and cost
            cat, ops = rc.category(), rc.op()
            cost = (costs or {}).get(r)
            if cost is None:
                cost = matching.cost(rc, waits[r])
        for phase, spans in rk["windows"].items():
            cats = rk["phases"][phase]["categories"]
            for c in COMM_CATS:
                cats[c]["exposed_wait_us"] = 0.0
            if not spans:
                continue
            if not known:
                continue
            lo = np.array([a for a, _ in spans])
            hi = np.array([b for _, b in spans])
            k = np.searchsorted(lo, rc.start, side="right") - 1
            in_win = (k >= 0) & (rc.start < hi[np.maximum(k, 0)])
            inside = in_win & (waits[r][0] > 0)  # NaN (unmatched) is not > 0
            base = (baselines or {}).get(r, np.full(len(rc), np.nan))
            floor = (floors or {}).get(r)
            for name in COMM_CATS:
                mine = in_win & (cat == name)
                if not mine.any():
                    continue
                sel = inside & mine
                cats[name]["exposed_wait_us"] += float(waits[r][0][sel].sum())
                cause.accumulate(rk, phase, name, mine, waits[r], base, floor)
                headroom.accumulate(rk, phase, name, mine, ops, cost, (targets or {}).get(r) or {}, offset or {})
            for c in COMM_CATS:
                cats[c]["exposed_wait_us"] = min(cats[c]["exposed_wait_us"], cats[c]["exposed_us"])
