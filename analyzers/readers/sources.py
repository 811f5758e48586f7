"""What a trace file holds, whatever its format: Kineto/Chrome JSON (one rank); or, one rank per
process and device, an Nsight Systems SQLite export or report, a rocprofv3 rocpd database, an RPD
file (rocmProfileData), a rocprofv3 JSON file. Decided here, from the file's first bytes (SQLite's
header, gzip's, the JSON's top-level key) rather than its name; the map (cross_rank/rank_map.py)
reads every file through `traces_in`, so the rest of the analysis never asks which format it was."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

from . import remote
from .kineto import load_trace
from .model import Trace, TraceError

SQLITE_SUFFIXES = (".sqlite", ".db", ".rpd")  # nsys export; rocprofv3's rocpd (%pid%_results.db); RPD
SQLITE_MAGIC = b"SQLite format 3\x00"


def head(path: Path, n: int = 4096) -> tuple[bytes, bool]:
    """The first `n` bytes of the file, inflated where it is gzip, and whether it is; b"" where it
    cannot be read (the reader that opens it then says why, in one line)."""
    try:
        with open(path, "rb") as f:
            start = f.read(2)
            f.seek(0)
            if start != b"\x1f\x8b":
                return f.read(n), False
            d = zlib.decompressobj(wbits=31)
            out = b""
            while len(out) < n and not d.eof and (raw := f.read(1 << 14)):
                out += d.decompress(raw, n - len(out))
            return out, True
    except (OSError, zlib.error):
        return b"", False


def is_sqlite(path: Path) -> bool:
    """Whether the file is an SQLite database (by its 16-byte header, not its name); the SQLite
    readers (and sqlite3) are imported only for one."""
    data, gz = head(path, 16)
    return data == SQLITE_MAGIC and not gz


def traces_in(file: str | Path, rank_from: str | None = None) -> Iterator[Trace]:
    """The ranks a file holds, one at a time. A URL's Kineto trace is streamed from where it is;
    an export named by a URL is copied to a local temporary file first (SQLite reads local files)."""
    if remote.is_url(file):
        if not remote.name_of(file).endswith((".nsys-rep", *SQLITE_SUFFIXES)):
            yield load_trace(file)
            return
        import tempfile

        with tempfile.TemporaryDirectory(prefix="commprobe-remote-") as tmp:
            for t in traces_in(remote.local_copy(file, tmp), rank_from):
                t.path = file if t.path.startswith(tmp) else t.path
                yield t
        return
    file = Path(file)
    if file.name.endswith(".nsys-rep"):
        import tempfile

        from . import nsys

        with tempfile.TemporaryDirectory(prefix="commprobe-nsys-") as tmp:
            yield from nsys.load_exports(nsys.from_report(file, Path(tmp)), rank_from)
        return
    start, gz = head(file)
    if start.startswith(SQLITE_MAGIC):
        if gz:  # SQLite reads a plain file: inflated into a temporary one, within the memory limit
            import tempfile

            with tempfile.TemporaryDirectory(prefix="commprobe-gz-") as tmp:
                plain = _gunzip(file, Path(tmp))
                for t in _sqlite(plain, rank_from, shown=file):
                    yield t
            return
        yield from _sqlite(file, rank_from)
        return
    if file.name.endswith(SQLITE_SUFFIXES) and not start.lstrip().startswith((b"{", b"[")):
        yield from _sqlite(file, rank_from)  # not SQLite's header: its reader says why in one line
        return
    from .rocprof_json import is_rocprof_json

    if is_rocprof_json(start):
        from .rocprof_json import load_json

        yield from load_json(file, rank_from)
        return
    yield load_trace(file)


def _gunzip(file: Path, into: Path) -> Path:
    """A gzip SQLite file inflated to `into`, in bounded pieces with the JSON readers' size limit."""
    from .limits import inflated, open_checked

    out = into / file.name.removesuffix(".gz")
    f, _, limit = open_checked(file, streamed=True)
    with f, open(out, "wb") as w:
        for piece in inflated(file, f, limit):
            w.write(piece)
    return out


def _sqlite(file: Path, rank_from: str | None, shown: Path | None = None) -> Iterator[Trace]:
    """An Nsight Systems export, a rocprofv3 rocpd database or an RPD file, told apart by their
    tables. `shown`: the name the user gave (a .gz the database was inflated from)."""
    from .sqlite_export import boundary, open_readonly, tables

    db = open_readonly(file)
    try:
        tabs = tables(db, file)
    finally:
        db.close()
    with boundary(shown or file):
        yield from _sqlite_format(file, tabs, rank_from, shown)


def _sqlite_format(file: Path, tabs: set[str], rank_from: str | None, shown: Path | None) -> Iterator[Trace]:
    from . import nsys, rocpd, rpd

    if rocpd.is_rocpd(tabs):
        load = rocpd.load_databases
    elif rpd.is_rpd(tabs):
        load = rpd.load_files
    elif nsys.is_export(tabs):
        load = nsys.load_exports
    else:
        raise TraceError(f"{shown or file}: an SQLite database that is none of the formats read here (tried: Nsight "
                         f"Systems export, rocprofv3 rocpd database, RPD file)")
    for t in load(file, rank_from):
        if shown is not None:
            t.path = t.path.replace(str(file), str(shown), 1)
        yield t
