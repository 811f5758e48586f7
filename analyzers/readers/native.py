"""The C trace scanner (`trace_scan.c`): JSON to event columns, streamed in chunks.

Why C: decoding a trace into one Python object per event and then building columns costs
several times the trace's size in memory and most of the analyzer's time; the scanner writes
ts, dur and name/cat/tid ids straight into arrays and keeps the raw args of communication
candidates only, reading the trace a chunk at a time, so memory holds one chunk plus the
columns (about a fifth of the JSON), not the trace. It is compiled on first use with the
system compiler and cached (common/native.py). Without a compiler, or with COMMPROBE_PURE_PYTHON
set, or on any input the scanner does not accept, the caller falls back to the msgspec
decoder, which gives the same columns and names the problem in bad input.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.ctypeslib  # noqa: F401  (numpy imports it lazily, on the first trace otherwise)

from commprobe.common.native import build_library

_SRC = Path(__file__).with_name("trace_scan.c")
_i64, _i32 = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int32)
_vp, _cp = ctypes.c_void_p, ctypes.c_char_p


@dataclass
class Scanned:
    """Columns of the complete events, in file order, as the scanner found them."""

    ts: np.ndarray
    dur: np.ndarray
    name_id: np.ndarray  # int32 into name_raw
    cat_id: np.ndarray
    tid_id: np.ndarray
    name_raw: list[bytes]  # raw JSON tokens (quotes and escapes included); id 0: the field was missing
    name_flags: np.ndarray  # uint8 per name_raw: 0 no hint, 1 a plain hint (args kept), 2 a '#' hint (corr)
    # (events of an '@' category keep their correlation too, whatever their name's flag)
    cat_raw: list[bytes]
    tid_raw: list[bytes]
    args: bytes  # raw args of the events whose name carries a hint, back to back
    # Sparse, ascending: the rows (file order) of events with args whose name carries a hint, and
    # for each its args span in `args` (offset -1: not kept, a '#' hint) and args "correlation" (-1).
    kept_row: np.ndarray  # int64
    args_off: np.ndarray  # int64
    args_len: np.ndarray  # int32
    corr: np.ndarray  # int64
    base_ns: int
    dist_raw: bytes | None
    meta_raw: bytes | None
    host_raw: bytes | None  # top-level host_name, raw JSON
    nbytes: int  # input bytes scanned
    fed: int  # bytes handed to the scanner in all (a cut unit is handed again with what follows)

    def kept(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For events `idx` (file order): their args offset (-1), length and correlation (-1)."""
        if not len(self.kept_row):
            return np.full(len(idx), -1, np.int64), np.zeros(len(idx), np.int32), np.full(len(idx), -1, np.int64)
        pos = np.minimum(np.searchsorted(self.kept_row, idx), len(self.kept_row) - 1)
        hit = self.kept_row[pos] == idx
        return (np.where(hit, self.args_off[pos], -1), np.where(hit, self.args_len[pos], 0).astype(np.int32),
                np.where(hit, self.corr[pos], -1))


@dataclass
class Refused:
    """Why the scanner did not accept the input, and where (a byte offset in the uncompressed JSON)."""

    code: int
    pos: int
    nbytes: int  # uncompressed bytes read before it stopped

    WHY = {1: "not valid JSON", 2: "a field of an unexpected type (or a key written with escapes)",
           3: "out of memory", 4: "no traceEvents array", 5: "a string or args object over {max} bytes",
           6: "\"traceEvents\" appears twice (which one is the trace is ambiguous)",
           7: "the document ends early (truncated?)",
           8: "more complete events than the memory here holds (each kept event costs ~{per_event} bytes)"}
    FINAL = frozenset({3, 5, 6, 7, 8})  # never worth a second decoder: it would refuse too, after more memory

    def reason(self, max_token: int, per_event: int = 0) -> str:
        why = self.WHY.get(self.code, f"scanner error {self.code}").format(max=max_token, per_event=per_event)
        return f"{why} at byte {self.pos}"


_LIB: ctypes.CDLL | None = None
_WHY = ""


def load_scanner() -> tuple[ctypes.CDLL | None, str]:
    """Compile (once per source and compiler, cached) and load the scanner; (None, why) when impossible."""
    global _LIB, _WHY
    if _LIB is not None or _WHY:
        return _LIB, _WHY
    # portable code: no -march, so the cached library suits any CPU that shares the cache
    lib, _WHY = build_library(_SRC, ["-O2", "-shared", "-fPIC", "-std=gnu11"], "the trace scanner")
    if lib is None:
        return None, _WHY
    lib.scan_open.argtypes, lib.scan_open.restype = [ctypes.POINTER(_cp), ctypes.c_int32], _vp
    lib.scan_close.argtypes, lib.scan_close.restype = [_vp], None
    lib.scan_feed.argtypes = [_vp, _vp, ctypes.c_int64, ctypes.c_int32]
    lib.scan_feed.restype = ctypes.c_int64
    lib.scan_error_pos.argtypes, lib.scan_error_pos.restype = [_vp], ctypes.c_int64
    lib.scan_set_max_token.argtypes, lib.scan_set_max_token.restype = [_vp, ctypes.c_int64], None
    lib.scan_set_max_rows.argtypes, lib.scan_set_max_rows.restype = [_vp, ctypes.c_int64], None
    lib.scan_kept.argtypes, lib.scan_kept.restype = [_vp], ctypes.c_int64
    lib.scan_error.argtypes, lib.scan_error.restype = [_vp], ctypes.c_int32
    lib.scan_rows.argtypes, lib.scan_rows.restype = [_vp], ctypes.c_int64
    lib.scan_base_ns.argtypes, lib.scan_base_ns.restype = [_vp], ctypes.c_int64
    lib.scan_column.argtypes, lib.scan_column.restype = [_vp, ctypes.c_int32], _vp
    lib.scan_drop_column.argtypes, lib.scan_drop_column.restype = [_vp, ctypes.c_int32], None
    lib.scan_table.argtypes = [_vp, ctypes.c_int32, ctypes.POINTER(_i64), ctypes.POINTER(_i32), ctypes.POINTER(_vp)]
    lib.scan_table.restype = ctypes.c_int64
    lib.scan_arena.argtypes, lib.scan_arena.restype = [_vp, ctypes.c_int32, _i64], _vp
    lib.scan_name_flags.argtypes, lib.scan_name_flags.restype = [_vp], ctypes.POINTER(ctypes.c_uint8)
    lib.args_fields.argtypes = [_cp, ctypes.c_int64, ctypes.c_int64, _i64, _i32, ctypes.c_int32, ctypes.POINTER(_cp),
                                _i32, _i32]
    lib.args_fields.restype = _vp
    lib.table_entries.argtypes = [_vp, ctypes.POINTER(_i64), ctypes.POINTER(_i32), ctypes.POINTER(_vp)]
    lib.table_entries.restype = ctypes.c_int64
    lib.table_free.argtypes, lib.table_free.restype = [_vp], None
    _LIB = lib
    return lib, ""


_COLUMNS = (("ts", np.float64), ("dur", np.float64), ("name_id", np.int32), ("cat_id", np.int32), ("tid_id", np.int32))
_KEPT = (("kept_row", np.int64), ("args_off", np.int64), ("args_len", np.int32), ("corr", np.int64))
MAX_TOKEN = 1 << 30  # the longest string, args object or top-level value the scanner takes (bytes)


def _entries(n: int, off, length, base) -> list[bytes]:
    offs = np.ctypeslib.as_array(off, shape=(n,)).tolist() if n else []
    lens = np.ctypeslib.as_array(length, shape=(n,)).tolist() if n else []
    return [ctypes.string_at(base.value + o, k) if k else b"" for o, k in zip(offs, lens)]


def _table(lib, s, which: int, missing: bytes) -> list[bytes]:
    off, length, base = _i64(), _i32(), _vp()
    n = lib.scan_table(s, which, ctypes.byref(off), ctypes.byref(length), ctypes.byref(base))
    out = _entries(n, off, length, base)
    return [missing] + out[1:] if out else out  # id 0: the field's default


def _arena(lib, s, which: int) -> bytes | None:
    n = ctypes.c_int64()
    p = lib.scan_arena(s, which, ctypes.byref(n))
    return None if n.value < 0 else ctypes.string_at(p, n.value) if n.value else b""


def _copy_out(lib, s, k: int, n: int, dtype) -> np.ndarray:
    """Column k of the scanner as a numpy copy, the scanner's freed at once."""
    p = lib.scan_column(s, k)
    out = (np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(np.ctypeslib.as_ctypes_type(dtype))), shape=(n,)).copy()
           if n else np.zeros(0, dtype))
    lib.scan_drop_column(s, k)
    return out


class _Window:
    """The scanner's input: one reused buffer holding the unscanned tail of the last feed (an event
    cut by the chunk's end) followed by the bytes read since. A file is read straight into it
    (readinto); chunks from an iterable are copied in. Concatenating `tail + chunk` instead cost a
    fresh allocation per chunk, page faults included (a tenth of the scan's time on a 200 MB set),
    and a second chunk of memory at peak."""

    def __init__(self, source, chunk: int):
        self._readinto = getattr(source, "readinto", None)
        self._pieces = None if self._readinto else iter(source)
        self.chunk = chunk
        self.buf = np.empty(chunk + (64 << 10), np.uint8)
        self.have = 0  # valid bytes at the front of buf

    def _room(self, n: int) -> None:
        if self.have + n > len(self.buf):  # a cut event longer than the slack: grow geometrically
            grown = np.empty(max(2 * len(self.buf), self.have + n), np.uint8)
            grown[:self.have] = self.buf[:self.have]
            self.buf = grown

    def fill(self) -> int:
        """Reads about a chunk in behind the tail: the bytes added, 0 at the end of the input."""
        if self._readinto is not None:
            self._room(self.chunk)
            got = self._readinto(self.buf[self.have:self.have + self.chunk]) or 0
            self.have += got
            return got
        got = 0
        while got < self.chunk and (piece := next(self._pieces, None)) is not None:
            self._room(len(piece))
            self.buf[self.have:self.have + len(piece)] = np.frombuffer(piece, np.uint8)
            self.have += len(piece)
            got += len(piece)
        return got

    def feed(self, lib, s, final: int) -> int:
        return lib.scan_feed(s, self.buf.ctypes.data, self.have, final)

    def drop(self, used: int) -> None:
        """Forgets the first `used` bytes (scanned): the tail moves to the front."""
        rest = self.have - used
        if rest and used:
            self.buf[:rest] = self.buf[used:self.have]  # numpy copies overlapping ranges correctly
        self.have = rest


def scan(source, hints: tuple[str, ...], max_token: int = MAX_TOKEN, max_rows: int = 1 << 62,
         chunk: int = 8 << 20) -> Scanned | Refused | None:
    """Columns of the complete events in the JSON read from `source` (a binary file, read with
    readinto, or an iterable of byte pieces, best small: they are copied in until a chunk is
    there), one chunk of about `chunk` bytes in memory at a time, with the raw args of events
    whose name contains one of `hints` (a hint written '#x': only the args' "correlation"
    number; '@x': events of category x, only that number); Refused (why, where) when the scanner does not accept the input; None when there is
    no scanner here.

    An event cut by a chunk's end is scanned again from its start with what follows; so that a huge
    event costs linear, not quadratic, time, the next attempt waits until the cut part has doubled."""
    if os.environ.get("COMMPROBE_PURE_PYTHON"):
        return None
    lib, _ = load_scanner()
    if lib is None:
        return None
    enc = [h.lower().encode() for h in hints]
    s = lib.scan_open((_cp * len(enc))(*enc), len(enc))
    if not s:
        return None
    try:
        lib.scan_set_max_token(s, max_token)
        lib.scan_set_max_rows(s, max_rows)
        win = _Window(source, chunk)
        start, total, fed, wait = 0, 0, 0, 0  # start: offset of the window's first byte in the input
        while got := win.fill():
            total += got
            if win.have < wait:
                continue
            used = win.feed(lib, s, 0)
            fed += win.have
            if used < 0:
                return Refused(int(lib.scan_error(s)), start + int(lib.scan_error_pos(s)), total)
            win.drop(used)
            start += used
            wait = 2 * win.have
        fed += win.have
        if win.feed(lib, s, 1) < 0 or lib.scan_error(s):
            pos = lib.scan_error_pos(s) if lib.scan_error(s) != 4 else 0
            return Refused(int(lib.scan_error(s)), start + int(pos), total)
        del win
        n, nk = lib.scan_rows(s), lib.scan_kept(s)
        cols = {name: _copy_out(lib, s, k, n, dtype) for k, (name, dtype) in enumerate(_COLUMNS)}
        cols.update({name: _copy_out(lib, s, 5 + k, nk, dtype) for k, (name, dtype) in enumerate(_KEPT)})
        names = _table(lib, s, 0, b'""')
        flags = np.ctypeslib.as_array(lib.scan_name_flags(s), shape=(len(names),)).copy() if names else np.zeros(0, np.uint8)
        return Scanned(**cols, name_raw=names, name_flags=flags, cat_raw=_table(lib, s, 1, b'""'),
                       tid_raw=_table(lib, s, 2, b"0"), args=_arena(lib, s, 0) or b"", base_ns=int(lib.scan_base_ns(s)),
                       dist_raw=_arena(lib, s, 1), meta_raw=_arena(lib, s, 2), host_raw=_arena(lib, s, 3), nbytes=total, fed=fed)
    finally:
        lib.scan_close(s)


def args_fields(data: bytes, off: np.ndarray, length: np.ndarray, keys: tuple[str, ...]) -> tuple[np.ndarray, list[bytes]]:
    """For events whose raw args lie at data[off:off+length]: an (n, len(keys)) matrix of value ids
    (-1: absent) into the returned list of raw JSON values. Requires the scanner (scan() gave the spans)."""
    lib, why = load_scanner()
    if lib is None:
        raise RuntimeError(why)
    n = len(off)
    off = np.ascontiguousarray(off, np.int64)
    length = np.ascontiguousarray(length, np.int32)
    out = np.empty((n, len(keys)), np.int32)
    enc = [k.encode() for k in keys]
    t = lib.args_fields(data, len(data), n, off.ctypes.data_as(_i64), length.ctypes.data_as(_i32), len(keys),
                        (_cp * len(enc))(*enc), (ctypes.c_int32 * len(enc))(*map(len, enc)), out.ctypes.data_as(_i32))
    if not t:
        raise MemoryError("args_fields: out of memory")
    try:
        o, ln, base = _i64(), _i32(), _vp()
        m = lib.table_entries(t, ctypes.byref(o), ctypes.byref(ln), ctypes.byref(base))
        return out, _entries(m, o, ln, base)
    finally:
        lib.table_free(t)
