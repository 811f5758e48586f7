"""One trace model for every analyzer: a Kineto/Chrome trace as numpy interval arrays.

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

import errno
import os
import re
import stat
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from operator import attrgetter
from pathlib import Path
from typing import Callable

import msgspec
import numpy as np

from commprobe.common.errors import InputError

from . import native

try:  # ISA-L inflates gzip about twice as fast as zlib here; same API, zlib as the fallback
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - platforms without isal wheels
    _inflate = zlib

DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "Kernel", "Memcpy", "Memset"})


class TraceError(InputError):
    """A trace (or directory of traces) that cannot be analyzed; the message is one line."""


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


@dataclass
class Trace:
    """Complete ('X') events of one rank, as parallel arrays sorted by start time."""

    path: str
    rank: int
    ts: np.ndarray  # float64 µs since origin_ns
    dur: np.ndarray  # float64 µs
    name_id: np.ndarray  # int32 into names
    cat_id: np.ndarray  # int32 into cats
    names: list[str]
    cats: list[str]
    tid_id: np.ndarray  # int32: one id per distinct thread (or stream) of the trace
    arg_row: np.ndarray  # int32 into arg_dicts; -1 for events whose args were not read
    arg_dicts: list[dict]  # distinct ARG_KEYS subsets of communication candidates' args
    arg_seq: np.ndarray  # int64: the collective's sequence number in its process group (args "Seq"), -1 unknown
    arg_corr: np.ndarray  # int64: the launch correlation id (args "correlation") of kernels and launches, -1 unknown
    origin_ns: int
    distributed: dict | None
    commprobe: dict | None
    uncompressed_bytes: int
    extra: dict = field(default_factory=dict)
    _device: np.ndarray | None = field(default=None, repr=False)

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    def is_device(self) -> np.ndarray:
        """Events on a device timeline (kernels, copies); computed once, every analyzer asks."""
        if self._device is None:
            dev = np.array([c in DEVICE_CATS for c in self.cats], dtype=bool)
            self._device = dev[self.cat_id] if len(self.cats) else np.zeros(0, bool)
        return self._device

    def args(self, i: int) -> dict:
        """The ARG_KEYS fields of event i's args ({} where absent or not read)."""
        r = int(self.arg_row[i])
        return self.arg_dicts[r] if r >= 0 else {}

    def events_named(self, idx: np.ndarray, pred: Callable[[str], bool]) -> np.ndarray:
        """Which of the events `idx` have a name for which `pred` holds (tested once per name)."""
        flags = np.fromiter(map(pred, self.names), bool, len(self.names))
        return flags[self.name_id[idx]] if len(self.names) else np.zeros(len(idx), bool)


_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


# Peak memory per complete event over the whole analysis (columns, sorting, classification,
# kernel-to-host-op links, attribution), interpreter aside: 115 B/event for plain events (5 M tiny
# events, bench/hostile.py), ~320 B/event when every event is a communication kernel, its launch
# or a host collective op (bench/sqlite_vs_json.py's trace). The README states the bound; the
# scanner refuses a trace with more events than free memory holds at this rate.
BYTES_PER_EVENT = 350


def max_events() -> int:
    """The most complete events one trace may have here: free memory / BYTES_PER_EVENT
    (COMMPROBE_MAX_TRACE_BYTES, when set, stands for free memory)."""
    return _available() // BYTES_PER_EVENT


def _available() -> int:
    env = os.environ.get("COMMPROBE_MAX_TRACE_BYTES")
    if env:
        return int(env)
    avail = 24 << 30
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    return avail


def max_trace_bytes(streamed: bool = False) -> int:
    """The largest uncompressed trace we take on: whole-trace decoding (msgspec) needs several
    times the trace in memory, so about a third of free memory; the streaming scanner needs one
    chunk plus columns of about a fifth of the trace, so up to twice free memory.
    COMMPROBE_MAX_TRACE_BYTES sets one limit for both."""
    if os.environ.get("COMMPROBE_MAX_TRACE_BYTES"):
        return _available()
    avail = _available()
    return avail * 2 if streamed else avail // 3


CHUNK = int(os.environ.get("COMMPROBE_CHUNK_BYTES") or 8 << 20)  # uncompressed bytes the scanner sees at a time


def _open_checked(path: Path | str, streamed: bool = False):
    """The open file, whether it is gzip, and the memory limit; refuses empty and too-large files.
    `path` may be an fsspec URL (remote.py)."""
    from . import remote

    if remote.is_url(path):
        f, size = remote.open_url(path)
    else:
        try:
            size = path.stat().st_size
        except OSError as e:
            raise TraceError(f"{path}: cannot read ({e.strerror})") from None
        f = None
    if size == 0:
        if f is not None:
            f.close()
        raise TraceError(f"{path}: empty file")
    limit = max_trace_bytes(streamed)
    if f is None:
        try:  # unbuffered: readall() sizes its buffer once (a buffered read after a seek grows it, twice the file at peak)
            f = open(path, "rb", buffering=0)
        except OSError as e:  # permission denied, a file removed meanwhile
            raise TraceError(f"{path}: cannot read ({e.strerror})") from None
    gz = f.read(2) == b"\x1f\x8b"
    if gz:
        # ISIZE (last 4 bytes) is the uncompressed size mod 2^32: a cheap first guard.
        f.seek(-4, os.SEEK_END)
        isize = int.from_bytes(f.read(4), "little")
        if max(isize, size) > limit:
            f.close()
            raise TraceError(f"{path}: too large for memory here (~{max(isize, size) / 1e9:.1f} GB "
                             f"uncompressed, limit {limit / 1e9:.1f} GB); analyze fewer steps or ranks")
    elif size > limit:
        f.close()
        raise TraceError(f"{path}: too large for memory here ({size / 1e9:.1f} GB, limit {limit / 1e9:.1f} GB)")
    f.seek(0)
    return f, gz, limit


def _gzip_error(path: Path, why) -> TraceError:
    return TraceError(f"{path}: truncated or corrupt gzip ({why})")


def _too_large(path: Path, limit: int) -> TraceError:
    return TraceError(f"{path}: too large for memory here (over {limit / 1e9:.1f} GB uncompressed)")


def _inflated(path: Path, f, limit: int):
    """A gzip file's uncompressed bytes in pieces of at most 1 MB (the scanner copies them into its
    window: a whole chunk per piece would hold a second chunk of memory), every member, CRC checked."""
    d, total = _inflate.decompressobj(wbits=31), 0  # gzip framing, CRC checked in C
    while True:
        if d.eof:  # members follow one another (pigz, bgzip, cat a.gz b.gz): read them all
            rest = d.unused_data + f.read(1 << 20) if d.unused_data else f.read(1 << 20)
            if not rest.strip(b"\0"):  # end of file (or the zero padding some tools add)
                return
            d, raw = _inflate.decompressobj(wbits=31), rest
        else:
            raw = d.unconsumed_tail or f.read(1 << 20)
            if not raw:
                raise _gzip_error(path, "stream ends early")
        try:
            out = d.decompress(raw, min(CHUNK, 1 << 20))
        except (zlib.error, _inflate.error) as e:
            raise _gzip_error(path, e) from None
        total += len(out)
        if total > limit:
            raise _too_large(path, limit)
        if out:
            yield out


def _read_bytes(path: Path) -> bytes:
    """The whole uncompressed trace at once (the msgspec path)."""
    f, gz, limit = _open_checked(path)
    with f:
        if gz:  # every member, never more than the limit in memory
            data = bytearray()
            for piece in _inflated(path, f, limit):
                data += piece
            data = bytes(data)
        else:
            data = f.readall() if hasattr(f, "readall") else f.read()  # fsspec files: read() is the whole file
    if len(data) > limit:
        raise _too_large(path, limit)
    if not data[:4096].strip() and not data.strip():
        raise TraceError(f"{path}: empty trace")
    return data


def _decode_values(path: Path, raws: list[bytes]) -> list:
    """Args values the scanner kept, decoded once each; JSON's rules: invalid UTF-8 or a number
    beyond double's range (1e400) is invalid input, as it is for the msgspec path."""
    try:
        return msgspec.json.decode(b"[" + b",".join(raws) + b"]") if raws else []
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
        raise TraceError(f"{path}: invalid JSON in an event's args ({e})") from None


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
        raise TraceError(f"{path}: not a Kineto/Chrome trace ({e})") from None
    except msgspec.DecodeError as e:
        raise TraceError(f"{path}: not JSON ({e})") from None


# The only args fields any analyzer reads (classify: the collective and its process group), and,
# only for events that record neither "In msg nelems" nor "dtype" (`nccl:all_to_all` in older
# PyTorch), their first input's dims and type: the message size (they differ on every call, so
# reading them for every event would multiply the distinct args subsets).
BASE_KEYS = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size", "Process Group Name",
             "Process Group Description")
INPUT_KEYS = ("Input Dims", "Input type")
ARG_KEYS = BASE_KEYS + INPUT_KEYS


# Per event, kept as numbers apart (they differ on every call, so they are no part of a shared subset):
SEQ_KEY = "Seq"  # the collective's sequence number in its process group
CORR_KEY = "correlation"  # links a kernel to the runtime call that launched it (Kineto)
_ALL_KEYS = (*ARG_KEYS, SEQ_KEY, CORR_KEY)


class _Args(msgspec.Struct, gc=False, rename={f"k{i}": k for i, k in enumerate(_ALL_KEYS)}):
    """The args members any analyzer reads, raw; others are skipped unread (as the scanner skips them)."""

    k0: msgspec.Raw = msgspec.Raw(b"")
    k1: msgspec.Raw = msgspec.Raw(b"")
    k2: msgspec.Raw = msgspec.Raw(b"")
    k3: msgspec.Raw = msgspec.Raw(b"")
    k4: msgspec.Raw = msgspec.Raw(b"")
    k5: msgspec.Raw = msgspec.Raw(b"")
    k6: msgspec.Raw = msgspec.Raw(b"")
    k7: msgspec.Raw = msgspec.Raw(b"")
    k8: msgspec.Raw = msgspec.Raw(b"")
    k9: msgspec.Raw = msgspec.Raw(b"")
    k10: msgspec.Raw = msgspec.Raw(b"")


_ARGS = msgspec.json.Decoder(_Args)


def _select(path: Path, raws: list[bytes], keys: tuple[str, ...]) -> tuple[np.ndarray, list[bytes]]:
    """Per args object (raw JSON), the raw values of `keys` as ids into the returned distinct raw
    values (-1: absent). JSON's rules, as the scanner's args_fields keeps them: escaped keys are the
    same key, the last of a repeated key counts, args that are not an object have no members, and
    members nobody reads are skipped unread (invalid UTF-8 or 1e400 there is no error)."""
    attrs = [f"k{_ALL_KEYS.index(k)}" for k in keys]
    out = np.full((len(raws), len(keys)), -1, np.int32)
    table: dict[bytes, int] = {}
    for i, r in enumerate(raws):
        try:
            a = _ARGS.decode(r)
        except msgspec.ValidationError:
            continue
        except (msgspec.DecodeError, RecursionError) as e:
            raise TraceError(f"{path}: invalid JSON in an event's args ({e})") from None
        for j, attr in enumerate(attrs):
            v = bytes(getattr(a, attr))
            if v:
                out[i, j] = table.setdefault(v, len(table))
    return out, list(table)


def _corr_values(ids: np.ndarray, raws: list[bytes]) -> np.ndarray:
    """Correlation ids from raw values, the scanner's rule: an integer token of 1 to 18 digits, else -1."""
    vals = np.array([int(r) if 1 <= len(r) <= 18 and r.isdigit() else -1 for r in raws] or [-1], np.int64)
    return np.where(ids >= 0, vals[np.maximum(ids, 0)], -1).astype(np.int64)


_IN, _DT = BASE_KEYS.index("In msg nelems"), BASE_KEYS.index("dtype")


def _arg_rows(path: Path, ids: np.ndarray, raws: list[bytes]) -> tuple[np.ndarray, list[dict], np.ndarray]:
    """Both readers' last step: ids (n, ARG_KEYS + Seq) into raw values -> a row per event into the
    distinct ARG_KEYS dicts, and Seq. INPUT_KEYS count only where neither "In msg nelems" nor
    "dtype" is given, and only values that count are decoded (so both readers refuse the same)."""
    if not len(ids):
        return np.zeros(0, np.int32), [], np.zeros(0, np.int64)
    ids = ids.copy()
    ids[(ids[:, _IN] >= 0) | (ids[:, _DT] >= 0), len(BASE_KEYS):len(ARG_KEYS)] = -1
    used = np.unique(ids[ids >= 0])
    remap = np.full(len(raws) + 1, -1, np.int64)
    remap[used] = np.arange(len(used))
    ids = np.where(ids >= 0, remap[np.maximum(ids, 0)], -1)
    values = _decode_values(path, [raws[i] for i in used.tolist()])
    rows, inverse = unique_rows(ids[:, :-1])
    dicts = [{k: values[v] for k, v in zip(ARG_KEYS, row.tolist()) if v >= 0} for row in rows]
    return inverse.astype(np.int32), dicts, _pick(ids[:, -1], _int_column(values))


def unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of an integer matrix in lexicographic order, and each row's index among
    them: np.unique(a, axis=0, return_inverse=True), by one lexsort (np.unique sorts the rows as
    structured records: 15 ms for 3,700 rows of 9 columns, ~50x this)."""
    if not len(a):
        return a[:0], np.zeros(0, np.int64)
    order = np.lexsort(a.T[::-1])
    s = a[order]
    new = np.ones(len(s), bool)
    new[1:] = (s[1:] != s[:-1]).any(axis=1)
    inverse = np.empty(len(s), np.int64)
    inverse[order] = np.cumsum(new) - 1
    return s[new], inverse


def _int_column(values: list) -> np.ndarray:
    """Non-negative integers as int64, -1 where absent or not an integer."""
    return np.fromiter((v if v.__class__ is int and 0 <= v < 1 << 63 else -1 for v in values), np.int64, len(values))


def _pick(ids: np.ndarray, column: np.ndarray) -> np.ndarray:
    """Per event, the int64 of value id `ids` (-1: absent) in `column`."""
    return np.where(ids >= 0, column[np.maximum(ids, 0)] if len(column) else -1, -1).astype(np.int64)


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
    kinds: np.ndarray | None = None  # int8 per name: _args_kind, where the reader already knows it


def _columns_native(path: Path) -> _Columns | None:
    """The C scanner's columns, streamed from the file (native.py), or None to fall back to msgspec
    (no scanner here, or input it refuses that the whole-document decoder may read or name better).
    Input refused for its size or shape (truncated, a token over native.MAX_TOKEN, "traceEvents"
    twice) is an error here: handing it to a whole-document decoder would only cost more memory."""
    f, gz, limit = _open_checked(path, streamed=True)
    with f:  # a plain file is read straight into the scanner's buffer
        s = native.scan(_inflated(path, f, limit) if gz else f, (*_HINTS, "#" + _LAUNCH), max_rows=max_events(),
                        chunk=CHUNK)
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
        """Rows whose args have a key written with escapes (-2 from the scanner): read by _select."""
        sub, more = _select(path, [raw_args[o:o + n] for o, n in zip(off[rows].tolist(), length[rows].tolist())], keys)
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
        need = np.flatnonzero((ids[:, _IN] < 0) & (ids[:, _DT] < 0) & (base[:, 0] != -2)) if len(base) else esc
        if len(need):
            more, raws2 = native.args_fields(raw_args, off[need], length[need], INPUT_KEYS)
            ids[need, len(BASE_KEYS):len(ARG_KEYS)] = np.where(more >= 0, more + len(raws), -1)
            raws = raws + raws2
        rows, dicts, seq = _arg_rows(path, ids, raws)
        return rows, dicts, seq, fix_corr(off, length, corr_col)

    def fix_corr(off: np.ndarray, length: np.ndarray, corr_col: np.ndarray) -> np.ndarray:
        esc = np.flatnonzero(corr_col == -2)
        if len(esc):
            ids, raws = np.full((len(corr_col), 1), -1, np.int32), []
            escaped(ids, off, length, esc, (CORR_KEY,), raws)
            corr_col[esc] = _corr_values(ids[esc, 0], raws)
        return corr_col

    def corr(idx: np.ndarray) -> np.ndarray:  # correlation ids: read by the scanner
        return fix_corr(*kept(idx))

    # The scanner matched the hints on each raw name (name_flags): that is _args_kind for a name
    # written without escapes; only escaped spellings are decided again on the decoded name.
    kinds = np.zeros(len(names), np.int8)
    kinds[name_map] = s.name_flags
    for i in (i for i, r in enumerate(s.name_raw) if b"\\" in r):
        kinds[name_map[i]] = _args_kind(names[name_map[i]])
    return _Columns(s.ts, s.dur, s.name_id, s.cat_id, s.tid_id, names, cats, s.base_ns, s.dist_raw, s.meta_raw, args,
                    s.nbytes, corr, kinds)


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
        ids, raws = _select(path, [bytes(ev[j].args) for j in keep[idx].tolist()], (*ARG_KEYS, SEQ_KEY, CORR_KEY))
        return (*_arg_rows(path, ids[:, :-1], raws), _corr_values(ids[:, -1], raws))

    def corr(idx: np.ndarray) -> np.ndarray:
        ids, raws = _select(path, [bytes(ev[j].args) for j in keep[idx].tolist()], (CORR_KEY,))
        return _corr_values(ids[:, 0], raws)

    return _Columns(np.fromiter(map(_get_ts, ev), np.float64, m)[keep], np.fromiter(map(_get_dur, ev), np.float64, m)[keep],
                    name_id[keep], cat_id[keep], tid_id[keep], names, cats, top.baseTimeNanoseconds,
                    None if top.distributedInfo == b"null" else bytes(top.distributedInfo),
                    None if top.commprobe == b"null" else bytes(top.commprobe), args, len(data), corr)


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
    from . import remote

    url = remote.is_url(path)
    path = path if url else Path(path)
    cols = _columns_native(path) or _columns_msgspec(path, _read_bytes(path))
    dist, meta = _decode_meta(cols.dist_raw), _decode_meta(cols.meta_raw)
    if rank is None:
        if isinstance(dist, dict) and isinstance(dist.get("rank"), int):
            rank = dist["rank"]
        else:
            m = _RANK_IN_NAME.search(remote.name_of(path) if url else path.name)
            rank = int(m.group(1)) if m else 0
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
    kinds = cols.kinds if cols.kinds is not None else np.fromiter(map(_args_kind, cols.names), np.int8, len(cols.names))
    cand = kinds == 1
    sorted_idx = np.flatnonzero(cand[name_id]) if len(cols.names) else np.zeros(0, np.int64)
    arg_row = np.full(len(ts), -1, np.int32)
    arg_seq = np.full(len(ts), -1, np.int64)
    arg_corr = np.full(len(ts), -1, np.int64)
    arg_row[sorted_idx], dicts, arg_seq[sorted_idx], arg_corr[sorted_idx] = cols.args(order[sorted_idx])
    # Kernel launches: only their correlation id (they are as many as kernels; no args subset).
    launch_idx = np.flatnonzero((kinds == 2)[name_id]) if len(cols.names) else np.zeros(0, np.int64)
    if len(launch_idx):
        arg_corr[launch_idx] = cols.corr(order[launch_idx])
    return Trace(str(path), rank, ts, dur, name_id, cat_id, cols.names, cols.cats, tid_id, arg_row, dicts, arg_seq, arg_corr,
                 cols.base_ns, dist, meta, cols.nbytes)


# Names whose events' args are kept: communication candidates (their collective, group, size,
# Seq, correlation) and the kernel families of classify's table (analyzers/comm_kernels.toml).
# Kernel-launch and graph-launch runtime calls (cudaLaunchKernel, cuLaunchKernel, hipLaunchKernel,
# hipExtLaunchKernel, cudaGraphLaunch, hipGraphLaunch, ...) keep only their correlation id.
_HINTS = ("nccl", "rccl", "reduce", "gather", "scatter", "all_to_all", "alltoall", "broadcast", "barrier", "send",
          "recv", "deep_ep", "mscclpp", "dda", "commprobe/comm", "record_param_comms", "c10d", "gloo:", "mpi:", "ucc:",
          "lamport", "dispatch", "combine", "notify", "nvshmem", "mori", "symm_mem", "multimem")


_HINT_RE = re.compile(b"|".join(re.escape(h.encode()) for h in _HINTS))  # one pass in C, not 28 substring tests
_LAUNCH = "launch"  # cudaLaunchKernel, cuLaunchKernel, hipLaunchKernel, cudaGraphLaunch, hipGraphLaunch, ...


@lru_cache(maxsize=1 << 16)  # ranks of one program share their names: decided once per process
def _args_kind(name: str) -> int:
    """1: a communication candidate (args read); 2: a kernel or graph launch (correlation only); 0."""
    low = name.encode("utf-8", "surrogatepass").lower()  # ASCII case only, as the scanner matches hints
    return 1 if _HINT_RE.search(low) else 2 if b"launch" in low else 0


_get_ph, _get_dur, _get_ts = attrgetter("ph"), attrgetter("dur"), attrgetter("ts")
_get_name, _get_cat, _get_tid = attrgetter("name"), attrgetter("cat"), attrgetter("tid")


def codes(values: np.ndarray, space: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_inverse=True) for integers, in O(n) with a lookup table where they
    span a small range (name x cat keys, string ids, kinds); `space`: the values are known to lie
    in [0, space), which spares the min/max pass."""
    if not len(values):
        return values[:0], np.zeros(0, np.int32)
    lo, hi = (0, space - 1) if space is not None else (int(values.min()), int(values.max()))
    if hi - lo > 1 << 24:
        uniq, inverse = np.unique(values, return_inverse=True)
        return uniq, inverse.reshape(-1)
    rel = values - lo if lo else values
    seen = np.zeros(hi - lo + 1, bool)
    seen[rel] = True
    uniq = np.flatnonzero(seen)
    lut = np.zeros(len(seen), np.int32)
    lut[uniq] = np.arange(len(uniq), dtype=np.int32)
    return uniq + lo, lut[rel]


def factorize(values: list) -> tuple[np.ndarray, list]:
    """Integer codes for a list of hashables (in order of first appearance), with the distinct
    values; C-level dict lookups only."""
    table = {v: i for i, v in enumerate(dict.fromkeys(values))}
    return np.fromiter(map(table.__getitem__, values), np.int64, len(values)), list(table)


TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".nsys-rep", ".db")  # Kineto JSON; Nsight, rocpd (sources.py)
BUNDLE_FILES = ("manifest.json", "timings.json")  # a bundle's own files, not traces


def is_trace_name(name: str) -> bool:
    """Whether a file in a run's directory (on disk or at a URL) is one of its rank traces: not a
    bundle's own file, not hidden."""
    return name.endswith(TRACE_SUFFIXES) and name not in BUNDLE_FILES and not name.startswith(".")


def _trace_files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.is_file() and is_trace_name(p.name))


def trace_files(path: str | Path) -> list[Path | str]:
    """The trace files `path` names: itself, or the rank traces in a directory; an fsspec URL
    (s3://bucket/run/) gives URLs."""
    from . import remote

    if remote.is_url(path):
        files = remote.trace_files(path, is_trace_name)
        if not files:
            raise _no_traces(path)
        return files
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise TraceError(f"{path}: a symbolic link loop") from None
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            raise TraceError(f"{path}: no such file or directory") from None
        raise TraceError(f"{path}: cannot read ({e.strerror})") from None
    if stat.S_ISREG(mode):
        return [path]
    if not stat.S_ISDIR(mode):
        raise TraceError(f"{path}: not a regular file or a directory (a FIFO, device or socket)")
    try:
        files = _trace_files(path)
    except OSError as e:
        raise TraceError(f"{path}: cannot list ({e.strerror})") from None
    if not files:
        raise _no_traces(path)
    return files


def _no_traces(path) -> TraceError:
    return TraceError(f"{path}: no traces (*.json, *.json.gz, Nsight *.sqlite or *.nsys-rep, rocpd *.db) "
                      "in this directory")


class RankSet:
    """The checks a directory of one run's traces must pass, fed one rank at a time: no rank twice,
    one world size."""

    def __init__(self, path: Path):
        self.path, self.seen, self.worlds = path, {}, set()

    def add(self, rank: int, file: str, distributed) -> None:
        if rank in self.seen:
            raise TraceError(f"{self.path}: mixed traces: rank {rank} appears in more than one file")
        self.seen[rank] = file
        if isinstance(distributed, dict) and distributed.get("world_size") is not None:
            if distributed["world_size"].__class__ is not int:
                raise TraceError(f"{file}: distributedInfo.world_size is not an integer "
                                 f"({str(distributed['world_size'])[:40]!r})")
            self.worlds.add(distributed["world_size"])
            if len(self.worlds) > 1:
                raise TraceError(f"{self.path}: mixed traces: world sizes {sorted(self.worlds)} in one directory")


def iter_traces(path: str | Path):
    """Load one rank at a time (memory holds one trace, not the run), checking the set as it goes."""
    from . import remote

    path = path if remote.is_url(path) else Path(path)
    ranks = RankSet(path)
    for f in trace_files(path):
        t = load_trace(f)
        ranks.add(t.rank, t.path, t.distributed)
        yield t
        del t  # not held while the next rank loads


def load_traces(path: str | Path) -> list[Trace]:
    """One file, or a directory of one run's rank traces, on one clock (the earliest base)."""
    traces = list(iter_traces(path))
    origin = min(t.origin_ns for t in traces)
    for t in traces:  # one clock for the run: shift each rank by its base's distance from the earliest
        t.ts += (t.origin_ns - origin) / 1000.0
        t.origin_ns = origin
    return sorted(traces, key=lambda t: t.rank)
