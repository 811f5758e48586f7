"""An engine's per-stage and merged files, joined or set aside by what they hold.

SGLang's `profile_by_stage` writes one file per rank *and stage* (`<id>-TP-<r>-EXTEND.trace.json.gz`,
`...-DECODE...`): one process's two stages, which read as "rank 0 appears in two files". Files
whose names differ only by a stage word, and whose traces name the same rank, are one rank's
stages: read as one trace (events on one clock, each file's threads kept apart), so each stage's
steps are windows of the same rank and neither stage alone shows the other's time as idle.

`merge_profiles` writes `merged-<id>.trace.json.gz` beside the rank files: the same events again,
all ranks in one file. Beside the per-rank files of its id it is set aside and named; alone it is
read as it is (its reader says what it holds).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from .model import Trace, TraceError

_STAGE = re.compile(r"[-_.](EXTEND|DECODE|PREFILL|MIXED|IDLE)(?=\.)", re.IGNORECASE)
_MERGED = re.compile(r"^merged-(.+?)\.trace\.json(?:\.gz)?$")


def stage_of(name: str) -> tuple[str, str | None]:
    """(the name without its stage word, the stage) where the name carries one."""
    m = _STAGE.search(name)
    return (name[:m.start()] + name[m.end():], m.group(1).upper()) if m else (name, None)


def group_files(files: list) -> tuple[list, list[dict]]:
    """The map's units, in file order: a path, or a tuple of one rank's per-stage paths; and the
    files set aside, [{file, why}] (an engine's merge of rank files that are also here)."""
    names = [Path(str(f)).name for f in files]
    skipped, keep = [], []
    for f, name in zip(files, names):
        m = _MERGED.match(name)
        if m and any(n != name and n.startswith(m.group(1)) for n in names):
            skipped.append({"file": str(f), "why": "an engine's merge of the rank files beside it (SGLang "
                                                    "merge_profiles): the same events again"})
        else:
            keep.append(f)
    groups: dict[str, list] = {}
    order = []
    for f in keep:
        base, stage = stage_of(Path(str(f)).name)
        key = base if stage else f"\0{f}"
        if key not in groups:
            order.append(key)
        groups.setdefault(key, []).append(f)
    units = [tuple(groups[k]) if len(groups[k]) > 1 else groups[k][0] for k in order]
    return units, skipped


def join(traces: list[Trace]) -> Trace:
    """One rank's per-stage traces as one: the events of all on the earliest file's clock, in start
    order; names, categories and argument rows re-indexed; each file's threads kept apart."""
    ranks = {t.rank for t in traces}
    if len(ranks) > 1:
        raise TraceError(f"{traces[0].path}: per-stage files of different ranks ({sorted(ranks)}) share a name: "
                         f"{', '.join(Path(t.path).name for t in traces)}")
    origin = min(t.origin_ns for t in traces)
    names, cats, name_ix, cat_ix = [], [], {}, {}
    cols = {k: [] for k in ("ts", "dur", "name_id", "cat_id", "tid_id", "arg_row", "arg_seq", "arg_corr")}
    dicts: list[dict] = []
    tids = 0
    for t in traces:
        nmap = np.array([name_ix.setdefault(n, len(name_ix)) for n in t.names] or [0], np.int32)
        cmap = np.array([cat_ix.setdefault(c, len(cat_ix)) for c in t.cats] or [0], np.int32)
        cols["ts"].append(t.ts + (t.origin_ns - origin) / 1000.0)
        cols["dur"].append(t.dur)
        cols["name_id"].append(nmap[t.name_id] if len(t.names) else t.name_id)
        cols["cat_id"].append(cmap[t.cat_id] if len(t.cats) else t.cat_id)
        cols["tid_id"].append(t.tid_id + tids)
        tids += int(t.tid_id.max()) + 1 if len(t.tid_id) else 0
        cols["arg_row"].append(np.where(t.arg_row >= 0, t.arg_row + len(dicts), -1).astype(np.int32))
        dicts += t.arg_dicts
        cols["arg_seq"].append(t.arg_seq)
        cols["arg_corr"].append(t.arg_corr)
    names = sorted(name_ix, key=name_ix.get)
    cats = sorted(cat_ix, key=cat_ix.get)
    c = {k: np.concatenate(v) for k, v in cols.items()}
    o = np.argsort(c["ts"], kind="stable")
    first = traces[0]
    extra = {**first.extra, "notes": [*first.extra.get("notes", ()),
                                      f"rank {first.rank}: {len(traces)} per-stage files read as one rank ("
                                      + ", ".join(Path(t.path).name for t in traces) + ")"]}
    return Trace(first.path, first.rank, c["ts"][o], c["dur"][o], c["name_id"][o].astype(np.int32),
                 c["cat_id"][o].astype(np.int32), names, cats, c["tid_id"][o].astype(np.int32),
                 c["arg_row"][o].astype(np.int32), dicts, c["arg_seq"][o], c["arg_corr"][o], origin,
                 first.distributed, first.commprobe, sum(t.uncompressed_bytes for t in traces), extra)
