"""What every reader of a multi-rank format shares (Nsight exports, rocpd and RPD databases,
rocprofv3 JSON): which rank each (process, device) pair is, and assembling a `Trace` from
per-source columns (device work, runtime calls, annotations), so each gives the Kineto path's
columns. One rank rule for all of them: `--rank-from` on the file name, else the process's own
rank where the format records it, else `rank N` in the file name, else the order of first work."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .limits import BYTES_PER_EVENT, max_events
from .model import Trace, TraceError, ascii_number, codes, evidence, rank_in_name, skipped_rows
from .native import Refused


def rank_for(path: Path, index: int, rank_from: str | None, from_process: int | None,
             device: int | None = None) -> tuple[int, str]:
    """(rank, the rule that chose it): `--rank-from` on the file name (plus the part's index), else
    the process's own rank, else `rank N` in the file name (plus the index), else the part's device
    index where every part has its own (torchrun's local rank is the device: a better guess than
    the order), else the order of first work."""
    if rank_from:
        m = re.search(rank_from, path.name)
        number = ascii_number(m.group(1)) if m and m.groups() else None
        if number is None:
            raise TraceError(f"{path}: --rank-from {rank_from[:80]!r} does not match the file name with a number in "
                             f"ASCII digits as its first group")
        return number + index, "--rank-from"
    if from_process is not None:
        return from_process, "the process's own rank"
    named = rank_in_name(path.name)
    if named is not None:
        return named + index, "the file name"
    if device is not None:
        return device, "the device index"
    return index, "the order of first work"


def each_part(path: Path, parts: list[tuple[int, int]], unit: str, own_rank: Callable[[int], int | None],
              rank_from: str | None, load: Callable[..., Trace],
              device_index: Callable[[int, int], int | None] | None = None, host: str | None = None) -> Iterator[Trace]:
    """One Trace per (process, device) pair of a database, one at a time: `load(pid, device, rank,
    first_of_process, label)`; `unit` names the pair in labels ("pid={},device={}"). `device_index`:
    the pair's device as an index (CUDA device id), used for the rank when nothing better names it
    and every part has a distinct one; `host`: the host the export records. Each trace says which
    rule chose its rank within the file (`rank_rule`) and carries the evidence the set's rule
    (cross_rank/identity.py) chooses from (`identity`)."""
    idx = [device_index(pid, dev) if device_index else None for pid, dev in parts]
    devices = list(idx)
    if None in idx or len(set(idx)) != len(idx):
        idx = [None] * len(parts)
    seen: set[int] = set()
    for i, (pid, dev) in enumerate(parts):
        label = str(path) if len(parts) == 1 else f"{path}#{unit.format(pid, dev)}"
        own = own_rank(pid)
        rank, rule = rank_for(path, i, rank_from, own, idx[i])
        t = load(pid, dev, rank, pid not in seen, label)
        for table, n in skipped_rows(path).items():  # the checked boundary's count (sqlite_export.query)
            t.extra.setdefault("notes", []).append(f"{path.name}: {n} row(s) of {table} skipped: a value that is "
                                                   f"not an integer (NULL, text, real or out of range)")
        t.extra["rank_rule"] = rule
        t.extra["identity"] = evidence(path.name, own, "the process's own record" if own is not None else None,
                                       host=host, pid=pid, device=devices[i], part=i)
        seen.add(pid)
        yield t


def each_part_of(path: Path, source, empty: str, unit: str, own_rank: Callable[[int], int | None],
                 rank_from: str | None, load: Callable[..., Trace],
                 device_index: Callable[[int, int], int | None] | None = None) -> Iterator[Trace]:
    """each_part over an opened database reader (`source`: its `parts()` and its connection
    `db`): `empty` says what the file lacks where it has no part; `load(source, pid, device, rank,
    first_of_process, label)`; the connection is closed however the iteration ends."""
    try:
        parts = source.parts()
        if not parts:
            raise TraceError(f"{path}: {empty}")
        host = source.host() if hasattr(source, "host") else None
        yield from each_part(path, parts, unit, own_rank, rank_from,
                             lambda pid, dev, rank, first, label: load(source, pid, dev, rank, first, label), device_index,
                             host)
    finally:
        source.db.close()


@dataclass
class Source:
    """One kind of event of one rank: times in ns, a name per row (codes into `names`), the
    Kineto category, a thread or stream key per row, and launch correlation ids (-1: none)."""

    start: np.ndarray
    end: np.ndarray
    code: np.ndarray
    names: list[str]
    cat: str
    thread: np.ndarray
    corr: np.ndarray
    device: bool


def assemble(label: str, rank: int, sources: list[Source], zero_ns: int, origin_ns: int, nbytes: int,
             extra: dict) -> Trace:
    """One Trace from the sources, sorted by start: times become µs since `zero_ns` (the sources'
    clock), which is Unix time `origin_ns`."""
    sources = [s for s in sources if len(s.start)]
    if not sources:
        raise TraceError(f"{label}: no device work, runtime calls or annotations for this process and device")
    if sum(len(s.start) for s in sources) > max_events():  # the JSON readers' bound (trace.BYTES_PER_EVENT)
        raise TraceError(f"{label}: {Refused.WHY[8].format(per_event=BYTES_PER_EVENT)}")
    names, offset, parts = [], 0, []
    for s in sources:
        parts.append(s.code.astype(np.int64) + offset)
        names.extend(s.names)
        offset += len(s.names)
    code = np.concatenate(parts)
    used, name_id = codes(code)
    # one id per distinct string (sources may name the same thing)
    distinct, remap = np.unique(np.array([names[i] for i in used.tolist()], dtype=object), return_inverse=True)
    name_id = remap[name_id]
    cat_names = sorted({s.cat for s in sources})
    cat = np.concatenate([np.full(len(s.start), cat_names.index(s.cat), np.int32) for s in sources])
    # device streams and host threads in two key spaces (a stream id and a thread id may collide);
    # distinct per source first (few threads, many events), then one id per (space, thread)
    keys: dict[tuple[bool, int], int] = {}
    tids = []
    for s in sources:
        threads, which = codes(s.thread.astype(np.int64))
        ids = np.array([keys.setdefault((s.device, v), len(keys)) for v in threads.tolist()], np.int32)
        tids.append(ids[which])
    tid_id = np.concatenate(tids)
    start = np.concatenate([s.start for s in sources]) - zero_ns
    end = np.concatenate([s.end for s in sources]) - zero_ns
    corr = np.concatenate([s.corr for s in sources])
    order = np.argsort(start, kind="stable")
    n = len(order)
    return Trace(label, rank, start[order] / 1000.0, np.maximum(end[order] - start[order], 0) / 1000.0,
                 name_id[order].astype(np.int32), cat[order], [str(x) for x in distinct], cat_names, tid_id[order],
                 np.full(n, -1, np.int32), [], np.full(n, -1, np.int64),
                 np.where(corr[order] > 0, corr[order], -1).astype(np.int64), origin_ns, None, None, nbytes, extra=extra)
