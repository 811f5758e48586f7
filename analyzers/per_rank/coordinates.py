"""A process group's axis declared by its ranks' coordinates (readers/coordinates.py: what
engines write into trace file names), where neither the group's name nor its description says.

vLLM builds its groups from one rank grid, world = (dp, pp, pcp, tp) (vllm/distributed/
parallel_state.py `initialize_model_parallel`): the TP group is the ranks that differ only in
their TP index; the DCP group a run of consecutive ranks inside it; the DP group the ranks that
differ only in their DP index; the EP group spans DP x TP; the PP group differs in PP only. The
EP index differs between any two ranks of the EP group (it is their index in it), so it tells
nothing of its own and is not read. An allreduce on vLLM's DP group (its per-step batch-size
sync) is therefore DP, not the TP allreduce the op alone implies.
"""

from __future__ import annotations

import numpy as np

from commprobe.common.vocab import AxisSource, category_for

_READ = ("dp", "pp", "tp", "dcp")


def group_axis(members: list[int], coords: dict[int, dict[str, int]]) -> tuple[str, str] | None:
    """(axis, why) of the group of `members` (global ranks), or None where a member has no
    coordinates or the coordinates do not say."""
    if len(members) < 2 or any(m not in coords for m in members):
        return None
    mine = [coords[m] for m in members]
    varies = {k for k in _READ if len({c.get(k) for c in mine}) > 1}
    why = f"ranks {members} differ in {' and '.join(sorted(varies)) or 'nothing'} (file-name coordinates)"
    if varies == {"pp"}:
        return "other", why  # pipeline stages: point-to-point, no axis of ours
    if varies == {"dp"}:
        return "dp", why
    if varies and varies <= {"tp", "dcp"}:
        # the whole TP slice of this (dp, pp) is the TP group; a part of it, the DCP group
        first = mine[0]
        slice_size = sum(1 for c in coords.values() if c.get("dp") == first.get("dp") and c.get("pp") == first.get("pp"))
        if len(members) == slice_size and "tp" in varies:
            return "tp", why
        return ("cp", why) if "dcp" in varies else None
    if {"dp", "tp"} <= varies and "pp" not in varies:
        return "ep", why
    return None


def pg_axes(distributed: dict | None, coords: dict[int, dict[str, int]]) -> dict[str, tuple[str, str]]:
    """Process group name -> (axis, why), for the groups the trace's distributedInfo lists with
    their ranks (`pg_config`: pg_name, ranks)."""
    if not coords or not isinstance(distributed, dict) or not isinstance(distributed.get("pg_config"), list):
        return {}
    out = {}
    for pg in distributed["pg_config"]:
        ranks = pg.get("ranks") if isinstance(pg, dict) else None
        if isinstance(ranks, list) and all(isinstance(r, int) for r in ranks):
            ax = group_axis(sorted(ranks), coords)
            if ax:
                out[str(pg.get("pg_name"))] = ax
    return out


def declare(trace_distributed: dict | None, coords: dict[int, dict[str, int]], comm_idx: np.ndarray, category: np.ndarray,
            comm_op: np.ndarray, comm_axis: np.ndarray, comm_group: np.ndarray, axis_source: np.ndarray) -> list[str]:
    """Collectives on a group whose axis the coordinates declare, and that nothing declared
    before (a group's name or description, our own spans), take that axis, declared; in place.
    Returns one note per group so declared."""
    axes = pg_axes(trace_distributed, coords)
    if not axes or not len(comm_idx):
        return []
    groups = comm_group[comm_idx]
    open_ = axis_source[comm_idx] != int(AxisSource.DECLARED)
    notes = []
    for name, (axis, why) in sorted(axes.items()):
        sel = comm_idx[open_ & (groups == name)]
        if not len(sel):
            continue
        comm_axis[sel] = axis
        axis_source[sel] = int(AxisSource.DECLARED)
        category[sel] = [category_for(op, axis) for op in comm_op[sel]]
        notes.append(f"group {name}: {axis}, {why}")
    return notes
