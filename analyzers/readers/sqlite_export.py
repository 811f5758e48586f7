"""What the SQLite readers share (nsys.py: Nsight Systems exports; rocpd.py: rocprofv3's rocpd;
rpd.py: rocmProfileData's RPD): opening a database read-only with one-line errors, and integer
queries into numpy a batch at a time.

This is the SQLite formats' checked boundary: text that is not UTF-8 is decoded with replacement
(never an error at fetch time); an integer query's rows whose values are not integers in int64's
range (NULL, text, a real, 1e300) are skipped and counted per table (model.count_skipped, said in
the result's reader notes), never a TypeError in numpy; and every sqlite3 error of a reader's walk
(a missing table, a view to nowhere, a malformed page) becomes one TraceError line naming the
file (`boundary`). Every query runs against a deadline (`Bounded`, limits.sql_seconds): a view or
recursive CTE that never ends is interrupted and named, in one line, like any other error."""

from __future__ import annotations

import re
import sqlite3
import time
from contextlib import contextmanager
from itertools import chain
from pathlib import Path

import numpy as np

from .model import TraceError, count_skipped, int64_row

BATCH = 1 << 16


class Bounded(sqlite3.Connection):
    """A connection whose every query has `seconds` to finish: a progress handler, called every
    few thousand SQLite VM steps (fetches included), interrupts the statement past its deadline;
    each execute() starts a new one. The interrupt surfaces as sqlite3's 'interrupted', which `why`
    turns into the line that names the bound (nothing else here interrupts a query)."""

    seconds = 5.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.deadline = time.monotonic() + self.seconds
        self.set_progress_handler(self._late, 10_000)

    def _late(self) -> int:
        return 1 if time.monotonic() > self.deadline else 0

    def execute(self, *args, **kwargs):
        self.deadline = time.monotonic() + self.seconds
        return super().execute(*args, **kwargs)


def why(e: Exception) -> str:
    msg = str(e)
    if "interrupted" in msg:
        return (f"a query ran past {Bounded.seconds:.0f} s, the bound on one SQLite query (a view or recursive CTE "
                f"that does not end?); COMMPROBE_SQL_SECONDS raises the bound")
    if "locked" in msg:
        return "the database is locked by another process"
    if "not a database" in msg or "malformed" in msg or "disk image" in msg:
        return f"not a readable SQLite database (truncated or corrupt: {msg})"
    return f"cannot read the SQLite database ({msg})"


def open_readonly(path: Path) -> sqlite3.Connection:
    """Read-only; `immutable` only where the first try cannot open (a read-only directory has no
    room for a lock file), never to read past another process's lock."""
    from .limits import sql_seconds

    last: Exception | None = None
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    Bounded.seconds = sql_seconds(size)
    for flags in ("mode=ro", "mode=ro&immutable=1"):
        try:
            db = sqlite3.connect(f"file:{path.resolve()}?{flags}", uri=True, timeout=1.0, factory=Bounded)
            db.text_factory = _text
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return db
        except UnicodeDecodeError:  # a corrupt schema page: sqlite's own message is not UTF-8
            raise TraceError(f"{path}: not a readable SQLite database (truncated or corrupt: its schema is not "
                             f"readable text)") from None
        except sqlite3.DatabaseError as e:  # OperationalError included
            last = e
            if "unable to open" not in str(e):
                break
    raise TraceError(f"{path}: {why(last)}")


def _text(raw: bytes) -> str:
    """TEXT as str, whatever its bytes (sqlite3's default raises on invalid UTF-8 mid-query)."""
    return raw.decode("utf-8", "replace")


@contextmanager
def boundary(path: Path):
    """A reader's walk over one database: any sqlite3 error, wherever a query happens to run, is
    one line naming the file; a value of a type no reader expected (a NULL or text where a number
    belongs, outside the checked integer queries) is one line too."""
    try:
        yield
    except TraceError:
        raise
    except sqlite3.Error as e:
        raise TraceError(f"{path}: {why(e)}") from None
    except (TypeError, ValueError, OverflowError) as e:
        raise TraceError(f"{path}: a value of the wrong type or out of range ({type(e).__name__}: "
                         f"{str(e)[:120]})") from None


def tables(db: sqlite3.Connection, path: Path) -> set[str]:
    """Tables and views (rocpd's unsuffixed names are views over uuid-suffixed tables)."""
    try:
        return {str(r[0]) for r in db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    except sqlite3.DatabaseError as e:
        raise TraceError(f"{path}: {why(e)}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a readable SQLite database (truncated or corrupt: its schema is not "
                         f"readable text)") from None


def schema_version(db: sqlite3.Connection, names: set[str]) -> str | None:
    """The `schema_version` a rocpd-lineage file records in `rocpd_metadata` (rocpd databases and
    RPD files both), or None."""
    row = (db.execute("SELECT value FROM rocpd_metadata WHERE tag = 'schema_version'").fetchone()
           if "rocpd_metadata" in names else None)
    return str(row[0])[:40] if row and row[0] is not None else None


def query(db: sqlite3.Connection, path: Path, sql: str, args: tuple = (), ncols: int = 0) -> np.ndarray:
    """All rows of an all-integer query (NULLs coalesced in the SQL) as an (n, ncols) int64 array,
    a batch at a time."""
    from .limits import BYTES_PER_EVENT, max_events

    most, seen = None, 0
    try:
        cur = db.execute(sql, args)
        parts = []
        while rows := cur.fetchmany(BATCH):  # the ints go straight into the array, no list of tuples kept
            seen += len(rows)
            if seen > BATCH and seen > (most := most or max_events()):  # bounded work: stop before memory does
                m = _FROM.search(sql)
                raise TraceError(f"{path}: {m.group(1) if m else 'a table'} holds more than {most:,} rows, more "
                                 f"than this machine's memory can analyze ({BYTES_PER_EVENT} bytes per event); "
                                 f"COMMPROBE_MAX_TRACE_BYTES raises the bound")
            try:
                parts.append(np.fromiter(chain.from_iterable(rows), np.int64, len(rows) * ncols).reshape(len(rows), ncols))
            except (TypeError, ValueError, OverflowError):  # a NULL, text, real or huge value: rows checked one by one
                parts.append(_checked_rows(rows, ncols, path, sql))
    except sqlite3.DatabaseError as e:
        raise TraceError(f"{path}: {why(e)}") from None
    return np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else np.zeros((0, ncols), np.int64)


_FROM = re.compile(r"\bFROM\s+([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)


def _checked_rows(rows: list[tuple], ncols: int, path: Path, sql: str) -> np.ndarray:
    """The rows whose every value is an integer in int64's range; the others skipped, counted under
    the query's first table."""
    good = [r for r in rows if len(r) == ncols and int64_row(r)]
    if len(good) < len(rows):
        m = _FROM.search(sql)
        table = m.group(1) if m else "a table"
        count_skipped(path, table, len(rows) - len(good))
    return np.array(good, np.int64).reshape(len(good), ncols)


def int_pairs(rows: list[tuple], n: int) -> list[tuple[int, ...]]:
    """The first `n` values of each row where all are integers in int64's range (the others left out)."""
    return [tuple(r[:n]) for r in rows if int64_row(r[:n])]


def lookup(db: sqlite3.Connection, sql: str, ids) -> dict[int, object]:
    """`sql` ("SELECT id, value FROM t WHERE id IN ({})") for the given ids, in chunks below
    SQLite's bound-parameter limit: {id: value}."""
    want = [int(i) for i in ids]
    got: dict[int, object] = {}
    for k in range(0, len(want), 900):
        chunk = want[k:k + 900]
        got.update(db.execute(sql.format(",".join("?" * len(chunk))), chunk).fetchall())
    return got
