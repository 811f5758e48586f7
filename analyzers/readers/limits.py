"""How much one trace may take, and getting its bytes: the memory bound per event, the largest
file taken on, opening a file or URL with those checks, and gzip inflated in bounded pieces.
Bad input raises TraceError with one line."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from . import remote
from .model import TraceError

try:  # ISA-L inflates gzip about twice as fast as zlib here; same API, zlib as the fallback
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - platforms without isal wheels
    _inflate = zlib


# Peak memory per complete event over the whole analysis (columns, sorting, classification,
# kernel-to-host-op links, attribution), interpreter aside: 115 B/event for plain events (5 M tiny
# events, bench/hostile.py), ~320 B/event when every event is a communication kernel, its launch
# or a host collective op (bench/sqlite_vs_json.py's trace). docs/robustness.md states the bound; the
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


def sql_seconds(nbytes: int) -> float:
    """The longest one SQLite query of a reader may run on a database of `nbytes`: 5 s plus 1 s per
    50 MB (a real export's largest query scans its kernel table at well over 100 MB/s here), so a
    view or CTE that recurses forever is one line in seconds, never a run that does not end.
    COMMPROBE_SQL_SECONDS sets it."""
    env = os.environ.get("COMMPROBE_SQL_SECONDS")
    if env:
        try:
            return max(0.01, float(env))
        except ValueError:
            raise TraceError(f"COMMPROBE_SQL_SECONDS={env[:40]!r} is not a number of seconds") from None
    return 5.0 + nbytes / 50e6


CHUNK = int(os.environ.get("COMMPROBE_CHUNK_BYTES") or 8 << 20)  # uncompressed bytes the scanner sees at a time


def open_checked(path: Path | str, streamed: bool = False):
    """The open file, whether it is gzip, and the memory limit; refuses empty and too-large files.
    `path` may be an fsspec URL (remote.py)."""
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


def inflated(path: Path, f, limit: int):
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


def read_bytes(path: Path) -> bytes:
    """The whole uncompressed trace at once (the msgspec path)."""
    f, gz, limit = open_checked(path)
    with f:
        if gz:  # every member, never more than the limit in memory
            data = bytearray()
            for piece in inflated(path, f, limit):
                data += piece
            data = bytes(data)
        else:
            data = f.readall() if hasattr(f, "readall") else f.read()  # fsspec files: read() is the whole file
    if len(data) > limit:
        raise _too_large(path, limit)
    if not data[:4096].strip() and not data.strip():
        raise TraceError(f"{path}: empty trace")
    return data
