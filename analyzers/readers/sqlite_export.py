"""What the SQLite readers share (nsys.py: Nsight Systems exports; rocpd.py: rocprofv3's rocpd;
rpd.py: rocmProfileData's RPD): opening a database read-only with one-line errors, and integer
queries into numpy a batch at a time."""

from __future__ import annotations

import sqlite3
from itertools import chain
from pathlib import Path

import numpy as np

from .model import TraceError

BATCH = 1 << 16


def why(e: Exception) -> str:
    msg = str(e)
    if "locked" in msg:
        return "the database is locked by another process"
    if "not a database" in msg or "malformed" in msg or "disk image" in msg:
        return f"not a readable SQLite database (truncated or corrupt: {msg})"
    return f"cannot read the SQLite database ({msg})"


def open_readonly(path: Path) -> sqlite3.Connection:
    """Read-only; `immutable` only where the first try cannot open (a read-only directory has no
    room for a lock file), never to read past another process's lock."""
    last: Exception | None = None
    for flags in ("mode=ro", "mode=ro&immutable=1"):
        try:
            db = sqlite3.connect(f"file:{path.resolve()}?{flags}", uri=True, timeout=1.0)
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return db
        except sqlite3.DatabaseError as e:  # OperationalError included
            last = e
            if "unable to open" not in str(e):
                break
    raise TraceError(f"{path}: {why(last)}")


def tables(db: sqlite3.Connection, path: Path) -> set[str]:
    """Tables and views (rocpd's unsuffixed names are views over uuid-suffixed tables)."""
    try:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    except sqlite3.DatabaseError as e:
        raise TraceError(f"{path}: {why(e)}") from None


def schema_version(db: sqlite3.Connection, names: set[str]) -> str | None:
    """The `schema_version` a rocpd-lineage file records in `rocpd_metadata` (rocpd databases and
    RPD files both), or None."""
    row = (db.execute("SELECT value FROM rocpd_metadata WHERE tag = 'schema_version'").fetchone()
           if "rocpd_metadata" in names else None)
    return str(row[0]) if row else None


def query(db: sqlite3.Connection, path: Path, sql: str, args: tuple = (), ncols: int = 0) -> np.ndarray:
    """All rows of an all-integer query (NULLs coalesced in the SQL) as an (n, ncols) int64 array,
    a batch at a time."""
    try:
        cur = db.execute(sql, args)
        parts = []
        while rows := cur.fetchmany(BATCH):  # the ints go straight into the array, no list of tuples kept
            parts.append(np.fromiter(chain.from_iterable(rows), np.int64, len(rows) * ncols).reshape(len(rows), ncols))
    except sqlite3.DatabaseError as e:
        raise TraceError(f"{path}: {why(e)}") from None
    return np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else np.zeros((0, ncols), np.int64)


def lookup(db: sqlite3.Connection, sql: str, ids) -> dict[int, object]:
    """`sql` ("SELECT id, value FROM t WHERE id IN ({})") for the given ids, in chunks below
    SQLite's bound-parameter limit: {id: value}."""
    want = [int(i) for i in ids]
    got: dict[int, object] = {}
    for k in range(0, len(want), 900):
        chunk = want[k:k + 900]
        got.update(db.execute(sql.format(",".join("?" * len(chunk))), chunk).fetchall())
    return got
