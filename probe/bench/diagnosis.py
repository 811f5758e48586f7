"""`commprobe bench diagnosis`: how often the analysis names the right cause, measured on runs
of the reference model with performance faults of known size (probe/faults.py).

Each case is one profiled run (TP=2, CP=2 or EP=2; gloo or DDA) with COMMPROBE_FAULT set to a
cause at a dose, or none (healthy). Doses per cause: one below what should be flagged
("below": its expected answer is no cause), and two that should be ("low", "high"). Each layout
and backend first gets a healthy reference run: its median transfer per op and size is the
zero-skew baseline the other runs are analyzed against (`analyze --calibration`), so a slower
transport is told from this machine's floor, measured the way the traces measure it.

A case is right when the primary cause (skew, slow-transfer or none), its culprit rank (skew
with one culprit; none for jitter and transfer) and its axis are the expected ones. The time
found is checked against the time injected where the injection's size is exact: a slower link
adds D µs to every call on its axis (transfer found = the faulty run's minus the healthy run's),
a host stall makes the other ranks wait D µs per layer (waiting caused by the stalled rank, less
the healthy run's).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from commprobe.common.vocab import AXIS_OF

# name -> (RunConfig fields, phase scored, axis category, layers)
LAYOUTS: dict[str, tuple[dict, str, str]] = {
    "tp2": ({"preset": "tiny", "tp": 2, "batch": 1, "prompt_len": 16, "decode_steps": 16}, "decode", "tp_allreduce"),
    "cp2": ({"preset": "tiny", "tp": 1, "cp": 2, "batch": 1, "prompt_len": 64, "decode_steps": 2, "profiled_repeats": 4},
            "prefill", "cp_ring"),
    "ep2": ({"preset": "moe-wide", "tp": 1, "ep": 2, "batch": 16, "prompt_len": 32, "decode_steps": 2,
             "profiled_repeats": 3}, "prefill",
            "ep_all_to_all"),
}
LAYERS = 2  # tiny and moe-wide: a host stall is injected once per layer

# cause -> COMMPROBE_FAULT spec, and per layout and backend its doses (below, low, high). Doses are
# set from this machine's noise (docs/accuracy.md): the low and high ones put
# the effect clear of what healthy runs show, the one below leaves it well under every bar.
DOSES: dict[str, dict] = {
    "slow-rank": {"spec": "slow-rank:1@{}",  # % of the rank's own compute
                  "tp2": {"dda": (3, 250, 400), "gloo": (3, 1500, 3000)},
                  "ep2": {"dda": (3, 400, 800), "gloo": (3, 800, 1600)}},
    "slow-link": {"spec": "slow-link:{axis}@{}",  # µs added inside every call on the axis
                  "tp2": {"dda": (1, 60, 300), "gloo": (5, 5000, 10000)},
                  "cp2": {"dda": (1, 150, 500), "gloo": (5, 5000, 10000)},
                  "ep2": {"dda": (1, 2000, 5000), "gloo": (5, 5000, 10000)}},
    "jitter": {"spec": "jitter@{}",  # µs: a random 0..D pause before every call, every rank
               "tp2": {"dda": (10, 4000, 8000), "gloo": (20, 20000, 40000)}},
    "host-stall": {"spec": "host-stall:1@{}",  # µs before every layer on rank 1
                   "tp2": {"dda": (5, 600, 1200), "gloo": (5, 6000, 12000)},
                   "cp2": {"dda": (5, 2500, 5000), "gloo": (5, 6000, 12000)}},
    "hot-expert": {"spec": "hot-expert:3@{}",  # % of tokens sent to expert 3 (on rank 1)
                   "ep2": {"dda": (10, 95, 100), "gloo": (10, 95, 100)}},
}
QUICK = (("tp2", "dda", None, None), ("tp2", "dda", "slow-rank", 2), ("tp2", "dda", "slow-link", 2),
         ("tp2", "dda", "jitter", 2), ("tp2", "dda", "host-stall", 2), ("ep2", "dda", "hot-expert", 2),
         ("cp2", "dda", "slow-link", 2), ("tp2", "gloo", None, None), ("tp2", "gloo", "host-stall", 2))
DOSE_NAMES = ("below", "low", "high")


@dataclass
class Case:
    layout: str
    backend: str
    cause: str | None  # the injected cause, None: healthy
    dose_name: str  # below | low | high | none
    spec: str | None  # COMMPROBE_FAULT
    expect: str  # skew | slow-transfer | none
    culprit: int | None
    category: str  # the axis's communication category


@dataclass
class Outcome:
    case: Case
    given: str
    given_culprit: int | None
    given_category: str | None
    verdict: str
    summary: str
    right: bool
    found_us: float | None = None  # per window, against the healthy run
    injected_us: float | None = None
    seconds: float = 0.0
    numbers: dict = field(default_factory=dict)


def _culprit_of(cause: str) -> int | None:
    """The rank every fault of the suite makes late: rank 1 (a hot expert: expert 3 of 4 on EP=2 is
    rank 1's); none for a slower link or jitter, which every rank has."""
    return 1 if cause in ("slow-rank", "host-stall", "hot-expert") else None


def cases(quick: bool = False, backends: tuple[str, ...] = ("dda", "gloo"), healthy: int = 2) -> list[Case]:
    """The suite: per layout and backend `healthy` healthy cases, and every cause at its three doses."""
    out = []

    def make(layout: str, backend: str, cause: str | None, dose: int | None) -> Case:
        cat = LAYOUTS[layout][2]
        if cause is None:
            return Case(layout, backend, None, "none", None, "none", None, cat)
        d = DOSES[cause]
        value = d[layout][backend][dose]
        spec = d["spec"].format(value, axis=AXIS_OF[cat]) if "{axis}" in d["spec"] else d["spec"].format(value)
        below = dose == 0
        expect = "none" if below else ("slow-transfer" if cause == "slow-link" else "skew")
        return Case(layout, backend, cause, DOSE_NAMES[dose], spec, expect,
                    None if below else _culprit_of(cause), cat)

    if quick:
        return [make(*q) for q in QUICK if q[1] in backends]
    for backend in backends:
        for layout in LAYOUTS:
            out += [make(layout, backend, None, None) for _ in range(healthy)]
            for cause, d in DOSES.items():
                if layout in d:
                    out += [make(layout, backend, cause, i) for i in range(3)]
    return out


def _run(layout: str, backend: str, spec: str | None, out: Path, timeout: float) -> None:
    """One profiled run of the layout with COMMPROBE_FAULT=spec: a bundle in `out`."""
    from commprobe.collectives.backends import process_group_backend

    from ..profile import run_profile
    from ..run import RunConfig

    fields = dict(LAYOUTS[layout][0])
    cfg = RunConfig(backends=[backend], repeats=1, out_dir=str(out), timeout=timeout, seed=0, **fields)
    old = os.environ.get("COMMPROBE_FAULT")
    os.environ["COMMPROBE_FAULT"] = spec or ""
    try:
        run_profile(cfg, cfg.model_config().to_dict(), pg_backend=process_group_backend(cfg.backends),
                    telemetry_interval=1.0)
    finally:
        if old is None:
            os.environ.pop("COMMPROBE_FAULT", None)
        else:
            os.environ["COMMPROBE_FAULT"] = old


def _phase(result: dict, layout: str) -> dict:
    return result["phases"][LAYOUTS[layout][1]]


def _calls_per_window(result: dict, phase: str, cat: str) -> float:
    """Calls of the category per window per rank, from the analysis' per-rank counts."""
    per = []
    for r in result["ranks"]:
        p = r["phases"].get(phase) or {}
        acc = (p.get("comm_calls") or {}).get(cat)
        if acc:
            per.append(acc["calls"] / max(1, p["windows"]))
    return statistics.median(per) if per else 0.0


def _found(case: Case, res: dict, healthy: dict) -> tuple[float | None, float | None]:
    """(found, injected) µs per window where the injection's size is exact; (None, None) otherwise."""
    if case.cause not in ("slow-link", "host-stall") or case.spec is None:
        return None, None
    dose = float(case.spec.rpartition("@")[2])
    phase = LAYOUTS[case.layout][1]
    c, h = _phase(res, case.layout)["communication_cause"] or {}, _phase(healthy, case.layout)["communication_cause"] or {}
    if case.cause == "slow-link":
        cat = case.category
        calls = _calls_per_window(res, phase, cat)
        per = (c.get("by_category") or {}).get(cat, {}).get("transfer_us_per_window", 0.0)
        base = (h.get("by_category") or {}).get(cat, {}).get("transfer_us_per_window", 0.0)
        return per - base, dose * calls
    ranks = len(res["ranks"])
    who = str(case.culprit if case.culprit is not None else 1)
    found = c.get("wait_caused_us_per_window", {}).get(who, 0.0) - h.get("wait_caused_us_per_window", {}).get(who, 0.0)
    return found, dose * LAYERS * (ranks - 1)


def score(case: Case, res: dict, seconds: float) -> Outcome:
    """The case's outcome from its analysis (the time found is added against the healthy run later)."""
    p = _phase(res, case.layout)
    c = p.get("communication_cause") or {"causes": [], "cause": "none"}
    top = c["causes"][0] if c["causes"] else None
    given = top["cause"] if top else "none"
    culprit = top.get("rank") if top else None
    category = top.get("category") if top else None
    right = given == case.expect and (given == "none" or (culprit == case.culprit and category == case.category))
    numbers = {k: c.get(k) for k in ("class", "transfer_share", "wait_share", "transfer_vs_baseline", "culprit",
                                     "wait_caused_by", "transfer_floor_vs_baseline")}
    numbers["other_cores"] = (c.get("host") or {}).get("other_cores")  # other work on the host while it ran
    return Outcome(case, given, culprit, category, p["verdict"], p["summary"], right, seconds=seconds, numbers=numbers)


def run_suite(todo: list[Case], workdir: Path | None = None, timeout: float = 120.0,
              on_case=lambda i, n, case: None) -> dict:
    """Run every case (each layout and backend's healthy reference first) and score it."""
    from commprobe.analyzers.analysis import analyze

    root = Path(workdir or tempfile.mkdtemp(prefix="commprobe-diagnosis-"))
    refs: dict[tuple, Path] = {}
    healthy: dict[tuple, dict] = {}
    outcomes: list[Outcome] = []
    results: list[dict] = []
    t_all = time.perf_counter()
    for i, case in enumerate(todo):
        on_case(i, len(todo), case)
        key = (case.layout, case.backend)
        if key not in refs:
            refs[key] = root / f"ref-{case.layout}-{case.backend}"
            _run(case.layout, case.backend, None, refs[key], timeout)
        d = root / f"case{i:02d}-{case.layout}-{case.backend}-{case.cause or 'healthy'}-{case.dose_name}"
        t = time.perf_counter()
        _run(case.layout, case.backend, case.spec, d, timeout)
        res = analyze(d, calibration=refs[key])
        if case.cause is None:
            healthy[key] = res
        results.append(res)
        outcomes.append(score(case, res, time.perf_counter() - t))
    for o, res in zip(outcomes, results):  # time found against the healthy run of the same layout and backend
        h = healthy.get((o.case.layout, o.case.backend))
        if h is not None:
            o.found_us, o.injected_us = _found(o.case, res, h)
    return summarize(outcomes, time.perf_counter() - t_all, root)


def summarize(outcomes: list[Outcome], seconds: float, root: Path) -> dict:
    labels = ("skew", "slow-transfer", "none")
    matrix = {e: {g: 0 for g in labels} for e in labels}
    for o in outcomes:
        matrix[o.case.expect][o.given] += 1
    right = sum(o.right for o in outcomes)
    healthy = [o for o in outcomes if o.case.cause is None]
    timed = [o for o in outcomes if o.found_us is not None and o.injected_us and o.case.expect != "none"]
    smallest: dict[str, dict] = {}
    for o in outcomes:
        if o.case.cause and o.right and o.case.expect != "none":
            k = f"{o.case.cause} ({o.case.layout}, {o.case.backend})"
            dose = float(o.case.spec.rpartition("@")[2])
            if k not in smallest or dose < smallest[k]["dose"]:
                smallest[k] = {"dose": dose, "spec": o.case.spec}
    for o in outcomes:
        k = f"{o.case.cause} ({o.case.layout}, {o.case.backend})"
        if o.case.cause and o.case.expect != "none" and k not in smallest:
            smallest[k] = {"dose": None, "spec": None}
    return {
        "schema": "commprobe.diagnosis/1",
        "cases": [{**asdict(o.case), **{k: v for k, v in asdict(o).items() if k != "case"}} for o in outcomes],
        "matrix": matrix,
        "accuracy": right / len(outcomes) if outcomes else 0.0,
        "right": right,
        "total": len(outcomes),
        "healthy_flagged": sum(o.given != "none" for o in healthy),
        "healthy": len(healthy),
        "time_found": [{"spec": o.case.spec, "layout": o.case.layout, "backend": o.case.backend,
                        "found_us": o.found_us, "injected_us": o.injected_us,
                        "error": (o.found_us - o.injected_us) / o.injected_us} for o in timed],
        "smallest_detected": dict(sorted(smallest.items())),
        "seconds": seconds,
        "workdir": str(root),
    }
