"""What a trace file holds, whatever its format: Kineto/Chrome JSON (one rank), or an Nsight
Systems SQLite export or report, or a rocprofv3 rocpd database (one rank per process and device). The map (ranks.py) reads
every file through `traces_in`, so the rest of the analysis never asks which format it was."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from . import remote
from .kineto import load_trace
from .model import Trace, TraceError

SQLITE_SUFFIXES = (".sqlite", ".db")  # nsys export; rocprofv3's rocpd (%pid%_results.db)
SQLITE_MAGIC = b"SQLite format 3\x00"


def is_sqlite(path: Path) -> bool:
    """Whether the file is an SQLite database (by its 16-byte header, not its name); the SQLite
    readers (and sqlite3) are imported only for one."""
    try:
        with open(path, "rb") as f:
            return f.read(16) == SQLITE_MAGIC
    except OSError:
        return False


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
    if file.name.endswith(SQLITE_SUFFIXES) or is_sqlite(file):
        yield from _sqlite(file, rank_from)
        return
    yield load_trace(file)


def _sqlite(file: Path, rank_from: str | None) -> Iterator[Trace]:
    """An Nsight Systems export or a rocprofv3 rocpd database, told apart by their tables."""
    from . import nsys, rocpd
    from .sqlite_export import open_readonly, tables

    db = open_readonly(file)
    try:
        tabs = tables(db, file)
    finally:
        db.close()
    if rocpd.is_rocpd(tabs):
        yield from rocpd.load_databases(file, rank_from)
    elif nsys.is_export(tabs):
        yield from nsys.load_exports(file, rank_from)
    else:
        raise TraceError(f"{file}: an SQLite database that is neither an Nsight Systems export nor a rocprofv3 rocpd "
                         f"database: not an nsys export")
