"""The per-rank *map* of an analysis: one trace in, a compact summary out (its per-phase
breakdown, its collective calls as arrays, its graph facts and kernel-link counts, its unknown
names), so that the cross-rank *reduce* (analysis.py: clocks, matching, straggler wait,
verdicts) never holds a rank's event columns. The map runs in this process or, with
`jobs > 1`, in a local pool of processes, one rank per task; results come back in file order,
so the analysis is the same whatever the number of jobs.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import collectives as coll
from .attribution import rank_breakdown
from .classify import Rule, classify
from .graphs import graph_facts
from .trace import load_trace


@dataclass
class RankSummary:
    rank: int
    path: str
    distributed: dict | None
    origin_ns: int
    uncompressed_bytes: int
    breakdown: dict  # attribution.rank_breakdown
    calls: coll.Calls  # one row per collective call (numpy arrays)
    graphs: dict
    links: dict[str, int]
    unknown_names: dict[str, int]


def summarize(file: str | Path, rules: list[Rule] = ()) -> RankSummary:
    """The map: everything the reduce needs from one rank's trace."""
    t = load_trace(file)
    cls = classify(t, list(rules))
    return RankSummary(t.rank, t.path, t.distributed, t.origin_ns, t.uncompressed_bytes, rank_breakdown(t, cls),
                       coll.primary_calls(t, cls), graph_facts(t), dict(cls.links), dict(cls.unknown_names))


def map_ranks(files: list[Path], rules: list[Rule] = (), jobs: int = 1):
    """Summaries of `files`, in their order: in this process (one rank in memory at a time) or in
    `jobs` worker processes. A worker's error (an unreadable trace) is raised here as it was."""
    jobs = max(1, min(jobs, len(files)))
    if jobs == 1:
        for f in files:
            yield summarize(f, rules)
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(summarize, f, list(rules)) for f in files]
        try:
            for fut in futures:
                yield fut.result()
        finally:
            for fut in futures:
                fut.cancel()


def default_jobs() -> int:
    """The usable cores (affinity mask, cgroup cpusets), COMMPROBE_JOBS overriding."""
    env = os.environ.get("COMMPROBE_JOBS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1
