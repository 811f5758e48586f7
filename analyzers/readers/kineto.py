"""Kineto/Chrome trace JSON into the trace model (model.py).

Decoding uses msgspec with typed structs that name only the fields we use (name, cat, ph,
ts, dur, tid; `args` kept raw and decoded only for the few events that need it), which
runs at several hundred MB/s; the per-event columns then become numpy arrays, and every
later step (classification by unique name, interval unions, windows) works on arrays.

Times are microseconds since `origin_ns` (Unix ns). A trace's own events are relative to its
`baseTimeNanoseconds`; a set of ranks is rebased onto the earliest base, so ranks of one run
line up, and telemetry stamped with Unix nanoseconds lines up too. (Absolute Unix µs in a
float64 would keep only 0.25 µs of resolution; relative times keep nanoseconds.)
Bad input raises TraceError with one line that names the file and the problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Callable

import msgspec
import numpy as np

from commprobe.common.vocab import LAUNCH_HINT, NAME_HINTS

from . import limits, native, remote
from .kineto_args import (
    A2A_KEYS,
    ARG_KEYS,
    BASE_KEYS,
    CORR_KEY,
    DT_COL,
    IN_COL,
    INPUT_KEYS,
    SEQ_KEY,
    SPLIT_KEYS,
    arg_rows,
    args_kind,
    corr_values,
    field_dicts,
    select,
)
from .limits import BYTES_PER_EVENT, inflated, max_events, open_checked, read_bytes
from .model import LAUNCH_CATS, Trace, TraceError, evidence, factorize, rank_in_name

_get_ph, _get_dur, _get_ts = attrgetter("ph"), attrgetter("dur"), attrgetter("ts")
_get_name, _get_cat, _get_tid = attrgetter("name"), attrgetter("cat"), attrgetter("tid")


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: float = 0.0
    dur: float = 0.0
    tid: int | str = 0
    args: msgspec.Raw = msgspec.Raw(b"null")


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[_Event]
    baseTimeNanoseconds: int = 0
    distributedInfo: msgspec.Raw = msgspec.Raw(b"null")
    commprobe: msgspec.Raw = msgspec.Raw(b"null")
    host_name: msgspec.Raw = msgspec.Raw(b"null")

def _twice(data: bytes, key: str) -> bool:
    """Whether the top-level object holds `key` more than once (msgspec keeps the last one
    silently). The exact check parses the document again, so it runs only where the key's
    spelling occurs twice at all; a key written with escapes is caught by the exact check only."""
    if data.count(b'"' + key.encode() + b'"') < 2:
        return False
    import json

    seen: list[int] = []
    try:
        # surrogateescape: bytes that are not UTF-8 in members nobody reads are no error here either
        json.loads(data.decode("utf-8", "surrogateescape"),
                   object_pairs_hook=lambda pairs: seen.append(sum(k == key for k, _ in pairs)))
    except (ValueError, RecursionError):
        return False  # msgspec names what is wrong
    return bool(seen) and seen[-1] > 1  # the top-level object's hook runs last


def _decode_top(path: Path, data: bytes) -> _Trace:
    if _twice(data, "traceEvents"):
        raise TraceError(f"{path}: {native.Refused.WHY[6]}")
    try:
        return msgspec.json.decode(data, type=_Trace)
    except RecursionError:
        raise TraceError(f"{path}: JSON nested too deeply to read") from None
    except msgspec.ValidationError as e:
        # A bare list of events is a valid Chrome trace too.
        try:
            events = msgspec.json.decode(data, type=list[_Event])
            return _Trace(traceEvents=events)
        except (msgspec.ValidationError, msgspec.DecodeError):
            pass
        raise TraceError(f"{path}: not a Kineto/Chrome trace ({e}); nor rocprofv3 JSON (no rocprofiler-sdk-tool key)"
                         ) from None
    except msgspec.DecodeError as e:
        raise TraceError(f"{path}: not JSON ({e})") from None


@dataclass
class _Columns:
    """Complete events in file order, from either decoder. `args(idx)` reads the ARG_KEYS fields of
    those events (a row id per event into a list of distinct dicts) and their Seq (int64, -1)."""

    ts: np.ndarray
    dur: np.ndarray
    name_id: np.ndarray
    cat_id: np.ndarray
    tid_id: np.ndarray
    names: list[str]
    cats: list[str]
    base_ns: int
    dist_raw: bytes | None
    meta_raw: bytes | None
    args: Callable[[np.ndarray], tuple[np.ndarray, list[dict], np.ndarray, np.ndarray]]
    nbytes: int  # uncompressed input size
    corr: Callable[[np.ndarray], np.ndarray]  # only the correlation ids of those events (kernel launches)
    kinds: np.ndarray | None = None  # int8 per name: args_kind, where the reader already knows it
    host_raw: bytes | None = None  # Kineto's top-level host_name (torch 2.x), raw JSON
    # Any of A2A_KEYS of those events: (value ids (n, len(keys)), raw values), -1 absent.
    fields: Callable[[np.ndarray, tuple[str, ...]], tuple[np.ndarray, list[bytes]]] | None = None


def _columns_native(path: Path) -> _Columns | None:
    """The C scanner's columns, streamed from the file (native.py), or None to fall back to msgspec
    (no scanner here, or input it refuses that the whole-document decoder may read or name better).
    Input refused for its size or shape (truncated, a token over native.MAX_TOKEN, "traceEvents"
    twice) is an error here: handing it to a whole-document decoder would only cost more memory."""
    f, gz, limit = open_checked(path, streamed=True)
    with f:  # a plain file is read straight into the scanner's buffer
        s = native.scan(inflated(path, f, limit) if gz else f, (*NAME_HINTS, "#" + LAUNCH_HINT, *("@" + c for c in LAUNCH_CATS)),
                        max_rows=max_events(),
                        chunk=limits.CHUNK)
    if s is None:
        return None
    if isinstance(s, native.Refused):
        if s.code in native.Refused.FINAL:
            raise TraceError(f"{path}: {s.reason(native.MAX_TOKEN, BYTES_PER_EVENT)}")
        return None
    try:  # each distinct raw token decoded once (escapes and UTF-8 checked by msgspec)
        names = msgspec.json.decode(b"[" + b",".join(s.name_raw) + b"]", type=list[str])
        cats = msgspec.json.decode(b"[" + b",".join(s.cat_raw) + b"]", type=list[str])
        tids = msgspec.json.decode(b"[" + b",".join(s.tid_raw) + b"]", type=list[int | str])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    # Different raw spellings of one string (escapes) get one id.
    name_map, names = factorize(names)
    cat_map, cats = factorize(cats)
    tid_map, _ = factorize(tids)
    for m, col in ((name_map, s.name_id), (cat_map, s.cat_id), (tid_map, s.tid_id)):
        np.take(m.astype(np.int32), col, out=col)  # in place: no second copy of an event column
    raw_args, kept = s.args, s.kept  # the closure holds these

    def escaped(ids: np.ndarray, off: np.ndarray, length: np.ndarray, rows: np.ndarray, keys, raws: list[bytes]):
        """Rows whose args have a key written with escapes (-2 from the scanner): read by select."""
        sub, more = select(path, [raw_args[o:o + n] for o, n in zip(off[rows].tolist(), length[rows].tolist())], keys)
        ids[rows] = np.where(sub >= 0, sub + len(raws), -1)
        raws.extend(more)

    def args(idx: np.ndarray) -> tuple[np.ndarray, list[dict], np.ndarray, np.ndarray]:
        off, length, corr_col = kept(idx)
        base, raws = native.args_fields(raw_args, off, length, (*BASE_KEYS, SEQ_KEY))
        ids = np.full((len(idx), len(ARG_KEYS) + 1), -1, np.int32)
        ids[:, :len(BASE_KEYS)], ids[:, -1] = base[:, :len(BASE_KEYS)], base[:, -1]
        esc = np.flatnonzero(base[:, 0] == -2) if len(base) else np.zeros(0, np.int64)
        if len(esc):
            escaped(ids, off, length, esc, (*ARG_KEYS, SEQ_KEY), raws)
        need = np.flatnonzero((ids[:, IN_COL] < 0) & (ids[:, DT_COL] < 0) & (base[:, 0] != -2)) if len(base) else esc
        if len(need):
            more, raws2 = native.args_fields(raw_args, off[need], length[need], INPUT_KEYS)
            ids[need, len(BASE_KEYS):len(ARG_KEYS)] = np.where(more >= 0, more + len(raws), -1)
            raws = raws + raws2
        rows, dicts, seq = arg_rows(path, ids, raws)
        return rows, dicts, seq, fix_corr(off, length, corr_col)

    def fix_corr(off: np.ndarray, length: np.ndarray, corr_col: np.ndarray) -> np.ndarray:
        esc = np.flatnonzero(corr_col == -2)
        if len(esc):
            ids, raws = np.full((len(corr_col), 1), -1, np.int32), []
            escaped(ids, off, length, esc, (CORR_KEY,), raws)
            corr_col[esc] = corr_values(ids[esc, 0], raws)
        return corr_col

    def corr(idx: np.ndarray) -> np.ndarray:  # correlation ids: read by the scanner
        return fix_corr(*kept(idx))

    def fields(idx: np.ndarray, keys: tuple[str, ...]) -> tuple[np.ndarray, list[bytes]]:
        off, length, _ = kept(idx)
        ids, raws = native.args_fields(raw_args, off, length, keys)
        esc = np.flatnonzero((ids == -2).any(1)) if len(ids) else np.zeros(0, np.int64)
        if len(esc):
            escaped(ids, off, length, esc, keys, raws)
        return ids, raws

    # The scanner matched the hints on each raw name (name_flags): that is args_kind for a name
    # written without escapes; only escaped spellings are decided again on the decoded name.
    kinds = np.zeros(len(names), np.int8)
    kinds[name_map] = s.name_flags
    for i in (i for i, r in enumerate(s.name_raw) if b"\\" in r):
        kinds[name_map[i]] = args_kind(names[name_map[i]])
    return _Columns(s.ts, s.dur, s.name_id, s.cat_id, s.tid_id, names, cats, s.base_ns, s.dist_raw, s.meta_raw, args,
                    s.nbytes, corr, kinds, s.host_raw, fields)


def _columns_msgspec(path: Path, data: bytes) -> _Columns:
    """One struct per event, then columns (C-level map/attrgetter loops): the portable path."""
    top = _decode_top(path, data)
    ev = top.traceEvents
    keep = np.flatnonzero(np.fromiter(map("X".__eq__, map(_get_ph, ev)), bool, len(ev)))
    if len(keep) > max_events():  # the scanner's cap, for the same answer (this path's bytes were capped first)
        raise TraceError(f"{path}: {native.Refused(8, 0, len(data)).reason(native.MAX_TOKEN, BYTES_PER_EVENT)}")
    m = len(ev)
    name_id, names = factorize(list(map(_get_name, ev)))
    cat_id, cats = factorize(list(map(_get_cat, ev)))
    tid_id, _ = factorize(list(map(_get_tid, ev)))

    def args(idx: np.ndarray) -> tuple[np.ndarray, list[dict], np.ndarray, np.ndarray]:
        ids, raws = select(path, [bytes(ev[j].args) for j in keep[idx].tolist()], (*ARG_KEYS, SEQ_KEY, CORR_KEY))
        return (*arg_rows(path, ids[:, :-1], raws), corr_values(ids[:, -1], raws))

    def corr(idx: np.ndarray) -> np.ndarray:
        ids, raws = select(path, [bytes(ev[j].args) for j in keep[idx].tolist()], (CORR_KEY,))
        return corr_values(ids[:, 0], raws)

    def fields(idx: np.ndarray, keys: tuple[str, ...]) -> tuple[np.ndarray, list[bytes]]:
        return select(path, [bytes(ev[j].args) for j in keep[idx].tolist()], keys)

    return _Columns(np.fromiter(map(_get_ts, ev), np.float64, m)[keep], np.fromiter(map(_get_dur, ev), np.float64, m)[keep],
                    name_id[keep], cat_id[keep], tid_id[keep], names, cats, top.baseTimeNanoseconds,
                    None if top.distributedInfo == b"null" else bytes(top.distributedInfo),
                    None if top.commprobe == b"null" else bytes(top.commprobe), args, len(data), corr,
                    host_raw=None if top.host_name == b"null" else bytes(top.host_name), fields=fields)


def _decode_meta(raw: bytes | None):
    if raw is None:
        return None
    try:
        meta = msgspec.json.decode(raw)
        if isinstance(meta, str):  # add_metadata_json stores a JSON string in some torch versions
            meta = msgspec.json.decode(meta.encode())
    except msgspec.DecodeError:
        return None
    return meta


def load_trace(path: str | Path, rank: int | None = None) -> Trace:
    url = remote.is_url(path)
    path = path if url else Path(path)
    cols = _columns_native(path) or _columns_msgspec(path, read_bytes(path))
    dist, meta = _decode_meta(cols.dist_raw), _decode_meta(cols.meta_raw)
    own = dist.get("rank") if isinstance(dist, dict) and isinstance(dist.get("rank"), int) else None
    name = remote.name_of(path) if url else path.name
    if rank is None:
        rank = own if own is not None else rank_in_name(name) or 0
    ts, dur = cols.ts, cols.dur
    if len(dur) and dur.min() < 0:
        i = int(dur.argmin())
        raise TraceError(f"{path}: event {cols.names[cols.name_id[i]][:60]!r} has a negative duration ({dur[i]} µs)")
    order = np.argsort(ts, kind="stable")  # Kineto does not promise order; analyzers rely on it
    del ts, dur

    def sorted_col(name: str, dtype) -> np.ndarray:  # one column at a time, the unsorted one let go
        out = getattr(cols, name)[order].astype(dtype, copy=False)
        setattr(cols, name, None)
        return out

    ts, dur = sorted_col("ts", np.float64), sorted_col("dur", np.float64)
    name_id, cat_id, tid_id = (sorted_col(c, np.int32) for c in ("name_id", "cat_id", "tid_id"))
    # Only communication candidates' args are ever read (ARG_KEYS of them); the input goes after this.
    # Decided on the decoded names, by both readers alike (the scanner kept the args of every name a
    # hint may match, escaped ones included, so what is asked for here was kept).
    kinds = cols.kinds if cols.kinds is not None else np.fromiter(map(args_kind, cols.names), np.int8, len(cols.names))
    cand = kinds == 1
    sorted_idx = np.flatnonzero(cand[name_id]) if len(cols.names) else np.zeros(0, np.int64)
    arg_row = np.full(len(ts), -1, np.int32)
    arg_seq = np.full(len(ts), -1, np.int64)
    arg_corr = np.full(len(ts), -1, np.int64)
    arg_row[sorted_idx], dicts, arg_seq[sorted_idx], arg_corr[sorted_idx] = cols.args(order[sorted_idx])
    # Kernel launches, and every event of a launch category (device work, runtime calls): only their
    # correlation id (as many as the kernels; no args subset). A CPU-only trace has none of them.
    launch_cat = np.fromiter((c.lower() in LAUNCH_CATS for c in cols.cats), bool, len(cols.cats))
    launch_idx = np.flatnonzero((kinds == 2)[name_id] | (launch_cat[cat_id] & (kinds != 1)[name_id])) \
        if len(cols.names) else np.zeros(0, np.int64)
    if len(launch_idx):
        arg_corr[launch_idx] = cols.corr(order[launch_idx])
    # torch's all-to-all ops: their split sizes where shapes were recorded (per_rank/traffic.py)
    a2a_name = np.fromiter((n.startswith("c10d::alltoall") for n in cols.names), bool, len(cols.names))
    a2a_idx = sorted_idx[a2a_name[name_id[sorted_idx]]] if len(sorted_idx) else sorted_idx
    a2a = field_dicts(path, a2a_idx, *cols.fields(order[a2a_idx], A2A_KEYS), A2A_KEYS) if len(a2a_idx) else {}
    # NCCL's all-to-all (record_param_comms, kernels): its "In/Out split size", where recorded
    a2a_rows = np.array([str(d.get("Collective name", "")).lower().replace("_", "").startswith("alltoall")
                         for d in dicts] or [False], bool)
    split_idx = sorted_idx[(arg_row[sorted_idx] >= 0) & a2a_rows[np.maximum(arg_row[sorted_idx], 0)]] \
        if len(sorted_idx) and dicts else sorted_idx[:0]
    if len(split_idx):
        a2a.update(field_dicts(path, split_idx, *cols.fields(order[split_idx], SPLIT_KEYS), SPLIT_KEYS))
    return Trace(str(path), rank, ts, dur, name_id, cat_id, cols.names, cols.cats, tid_id, arg_row, dicts, arg_seq, arg_corr,
                 cols.base_ns, dist, meta, cols.nbytes,
                 extra={"identity": evidence(name, own, "distributedInfo" if own is not None else None,
                                             host=_host_name(cols.host_raw))}, a2a_args=a2a)


def _host_name(raw: bytes | None) -> str | None:
    """Kineto's top-level `host_name` (torch 2.x writes socket.gethostname()): the host the trace
    was recorded on, where it is a plain name (anything else is no evidence)."""
    try:
        name = msgspec.json.decode(raw) if raw is not None else None
    except msgspec.DecodeError:
        return None
    return name[:253] if isinstance(name, str) and name.strip() and "\n" not in name else None
