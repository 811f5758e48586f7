"""The per-rank pipeline: one file in, a compact summary per rank it holds out. Its body lists
the steps in order, each a module of this package: read (readers/) -> classify -> link kernels to
the host ops that launched them -> windows per phase and exposed time per category (attribution,
with phases.py's rules) -> the rank's collective calls -> graph facts -> counts of device work. The summary (per-phase
breakdown, calls as arrays, counts) is all the cross-rank step ever sees of a rank, so a rank's
event columns are never held beside another's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..readers.coordinates import name_coordinates
from ..readers.sources import traces_in
from ..readers.stages import join
from .attribution import rank_breakdown
from .calls import Calls, primary_calls
from .classify import Rule, classify
from .counts import device_counts
from .graphs import graph_facts
from .links import link_kernels_to_host_ops
from .traffic import rank_traffic


@dataclass
class RankSummary:
    rank: int
    path: str
    distributed: dict | None
    origin_ns: int
    uncompressed_bytes: int
    breakdown: dict  # attribution.rank_breakdown
    calls: Calls  # one row per collective call (numpy arrays)
    graphs: dict
    links: dict[str, int]
    unknown_names: dict[str, int]
    reader: dict  # the format read and what its reader has to say (notes), from Trace.extra
    axis_notes: list[str]  # why an axis is not the op's default (classify)
    traffic: dict = field(default_factory=dict)  # all-to-all bytes to/from each group rank per phase (traffic.py)


def _traces(file, rank_from: str | None):
    """The ranks a unit of the map holds: a file's, or one rank's per-stage files read as one."""
    if isinstance(file, tuple):
        yield join([t for f in file for t in traces_in(f, rank_from)])
    else:
        yield from traces_in(file, rank_from)


def summarize(file: str | Path | tuple, rules: list[Rule] = (), rank_from: str | None = None,
              coords: dict[int, dict[str, int]] | None = None) -> list[RankSummary]:
    """Everything the cross-rank step needs from each rank a file holds (one for a Kineto trace; one
    per process and device for an Nsight export), one rank in memory at a time. `coords`: every
    rank's coordinates from engines' file names (readers/coordinates.py), for the groups' axes."""
    out = []
    for trace in _traces(file, rank_from):
        name_coordinates(trace)
        cls = classify(trace, list(rules), coords)
        link_kernels_to_host_ops(trace, cls)
        breakdown = {**rank_breakdown(trace, cls), "device_work": device_counts(trace, cls)}
        if "coordinates" in trace.extra:
            breakdown["coordinates"] = trace.extra["coordinates"]
        calls = primary_calls(trace, cls)
        traffic = rank_traffic(trace, calls, breakdown["windows"], trace.a2a_args)
        calls.event = None  # the cross-rank step never looks into a rank's trace
        out.append(RankSummary(trace.rank, trace.path, trace.distributed, trace.origin_ns, trace.uncompressed_bytes,
                               breakdown, calls, graph_facts(trace), dict(cls.links), dict(cls.unknown_names),
                               {"format": "kineto json", **trace.extra}, list(cls.axis_notes), traffic))
        del trace, cls
    return out
