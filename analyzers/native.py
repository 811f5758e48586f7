"""The C trace scanner (`trace_scan.c`): JSON bytes to event columns in one pass.

Why C: decoding a trace into one Python object per event and then building columns costs
several times the trace's size in memory and most of the analyzer's time; the scanner writes
ts, dur, name/cat ids and the byte spans of tid/args straight into arrays. It is compiled on
first use with the system compiler (no build step at install, nothing for a laptop without a
compiler to trip on) and cached per source and compiler. Without a compiler, or with
COMMPROBE_PURE_PYTHON set, or on any input the scanner does not accept, the caller falls back
to the msgspec decoder, which gives the same columns and names the problem in bad input.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.ctypeslib  # noqa: F401  (numpy imports it lazily, on the first trace otherwise)

_SRC = Path(__file__).with_name("trace_scan.c")
_i64, _i32, _dbl = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_double)


class _Table(ctypes.Structure):
    _fields_ = [("n", ctypes.c_int64), ("cap", ctypes.c_int64), ("off", _i64), ("len", _i32),
                ("hash", ctypes.POINTER(ctypes.c_uint32)), ("slot", _i32), ("nslots", ctypes.c_int64)]


class _Scan(ctypes.Structure):
    _fields_ = [("n", ctypes.c_int64), ("cap", ctypes.c_int64), ("ts", _dbl), ("dur", _dbl), ("name", _i32),
                ("cat", _i32), ("tid", _i32), ("args_off", _i64), ("args_len", _i32),
                ("names", _Table), ("cats", _Table), ("tids", _Table), ("base_ns", ctypes.c_int64), ("dist_off", ctypes.c_int64),
                ("meta_off", ctypes.c_int64), ("dist_len", ctypes.c_int32), ("meta_len", ctypes.c_int32),
                ("err_pos", ctypes.c_int64), ("err", ctypes.c_int32)]


@dataclass
class Scanned:
    """Columns of the complete events, in file order, as the scanner found them."""

    ts: np.ndarray
    dur: np.ndarray
    name_id: np.ndarray  # int32 into name_raw
    cat_id: np.ndarray
    tid_id: np.ndarray
    name_raw: list[bytes]  # raw JSON tokens (quotes and escapes included); id 0: the field was missing
    cat_raw: list[bytes]
    tid_raw: list[bytes]
    args_off: np.ndarray  # int64 offset of the raw args value (-1: missing)
    args_len: np.ndarray  # int32
    base_ns: int
    dist_raw: bytes | None
    meta_raw: bytes | None


_LIB: ctypes.CDLL | None = None
_WHY = ""


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "commprobe"


def load_scanner() -> tuple[ctypes.CDLL | None, str]:
    """Compile (once per source and compiler, cached) and load the scanner; (None, why) when impossible."""
    global _LIB, _WHY
    if _LIB is not None or _WHY:
        return _LIB, _WHY
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc or not shutil.which(cc):
        _WHY = "no C compiler found (set CC)"
        return None, _WHY
    if not _SRC.exists():
        _WHY = f"{_SRC.name} is not installed beside native.py"
        return None, _WHY
    flags = ["-O2", "-shared", "-fPIC", "-std=gnu11"]  # portable code: no -march, the cache may be shared
    key = hashlib.sha256(_SRC.read_bytes() + " ".join([cc, *flags]).encode()).hexdigest()[:16]
    so = _cache_dir() / f"trace_scan-{key}.so"
    try:
        if not so.exists():
            so.parent.mkdir(parents=True, exist_ok=True)
            tmp = so.with_suffix(f".{os.getpid()}.tmp")
            r = subprocess.run([cc, *flags, "-o", str(tmp), str(_SRC)], capture_output=True, text=True)
            if r.returncode:
                _WHY = f"compiling {_SRC.name} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}"
                return None, _WHY
            os.replace(tmp, so)  # atomic: concurrent builders leave one complete file
        lib = ctypes.CDLL(str(so))
    except OSError as e:
        _WHY = f"could not build or load the trace scanner: {e}"
        return None, _WHY
    lib.trace_scan.argtypes, lib.trace_scan.restype = [ctypes.c_char_p, ctypes.c_int64], ctypes.POINTER(_Scan)
    lib.trace_scan_free.argtypes, lib.trace_scan_free.restype = [ctypes.POINTER(_Scan)], None
    lib.args_fields.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, _i64, _i32, ctypes.c_int32,
                                ctypes.POINTER(ctypes.c_char_p), _i32, _i32]
    lib.args_fields.restype = ctypes.POINTER(_Table)
    lib.table_free.argtypes, lib.table_free.restype = [ctypes.POINTER(_Table)], None
    lib.scan_free_ptr.argtypes, lib.scan_free_ptr.restype = [ctypes.c_void_p], None
    _LIB = lib
    return lib, ""


def _col(ptr, n: int, dtype) -> np.ndarray:
    return np.ctypeslib.as_array(ptr, shape=(n,)).astype(dtype, copy=True) if n else np.zeros(0, dtype)


def _raws(data: bytes, t: _Table, missing: bytes = b'""') -> list[bytes]:
    off, ln = _col(t.off, t.n, np.int64), _col(t.len, t.n, np.int64)
    return [missing if o < 0 else data[o:o + k] for o, k in zip(off.tolist(), ln.tolist())]


def scan(data: bytes) -> Scanned | None:
    """Columns of `data`'s complete events, or None (no scanner here, or input it does not accept)."""
    if os.environ.get("COMMPROBE_PURE_PYTHON"):
        return None
    lib, _ = load_scanner()
    if lib is None:
        return None
    res = lib.trace_scan(data, len(data))
    if not res:
        return None
    try:
        s = res.contents
        if s.err:
            return None
        n = s.n

        def take(name: str, dtype) -> np.ndarray:  # copy a column out, free it at once
            out = _col(getattr(s, name), n, dtype)
            lib.scan_free_ptr(ctypes.cast(getattr(s, name), ctypes.c_void_p))
            setattr(s, name, None)  # NULL: trace_scan_free skips it
            return out

        return Scanned(take("ts", np.float64), take("dur", np.float64), take("name", np.int32), take("cat", np.int32),
                       take("tid", np.int32), _raws(data, s.names), _raws(data, s.cats), _raws(data, s.tids, b"0"),
                       take("args_off", np.int64), take("args_len", np.int32), int(s.base_ns),
                       data[s.dist_off:s.dist_off + s.dist_len] if s.dist_off >= 0 else None,
                       data[s.meta_off:s.meta_off + s.meta_len] if s.meta_off >= 0 else None)
    finally:
        lib.trace_scan_free(res)


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
                        (ctypes.c_char_p * len(enc))(*enc), (ctypes.c_int32 * len(enc))(*map(len, enc)),
                        out.ctypes.data_as(_i32))
    if not t:
        raise MemoryError("args_fields: out of memory")
    try:
        return out, _raws(data, t.contents, b"null")
    finally:
        lib.table_free(t)
