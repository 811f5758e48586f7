"""rocprofv3's rocpd databases (its default output, `%hostname%/%pid%_results.db`) as the trace model.

Written from AMD's documented schema (ROCm/rocprofiler-sdk source/share/rocprofiler-sdk-rocpd/
rocpd_tables.sql and rocpd_views.sql, schema_version 3): the data lives in uuid-suffixed tables
with unsuffixed views over them (`rocpd_kernel_dispatch`, `rocpd_memory_copy`, `rocpd_region`,
`rocpd_timestamp`, `rocpd_track`, `rocpd_event`, `rocpd_string`, `rocpd_info_kernel_symbol`,
`rocpd_info_process`, `rocpd_metadata`), which is what is read here. Kernel dispatches and copies
are device work on their track's agent (GPU) and queue/stream; regions are host calls: HIP and HSA
API calls become `cuda_runtime` events (as Kineto writes HIP calls on ROCm), markers (roctx) and
RCCL API calls (`ncclAllReduce`, ...) host annotations. The event table's `correlation_id` links a
dispatch to the API call that enqueued it, as Kineto's `correlation` does. Each (process, GPU
agent) pair is one rank; its rank number comes from `--rank-from`, else the launcher's variable in
the process's recorded environment (RANK, OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK,
SLURM_PROCID), else `rank N` in the file name, else its position.

Not verified against a database rocprofv3 wrote (none is among the shared traces): the tests
build one from the documented columns.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np

from .model import TraceError, codes
from .parts import Source, assemble, each_part_of
from .sqlite_export import int_pairs, lookup, open_readonly, query, schema_version, tables

KNOWN_SCHEMAS = ("3",)
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")
_TIMES = ("JOIN rocpd_timestamp DS ON DS.id = X.start_id JOIN rocpd_timestamp DE ON DE.id = X.end_id "
          "JOIN rocpd_track T ON T.id = X.track_id LEFT JOIN rocpd_event E ON E.id = X.event_id")


def is_rocpd(tabs: set[str]) -> bool:
    return {"rocpd_kernel_dispatch", "rocpd_timestamp", "rocpd_track"} <= tabs


class Database:
    def __init__(self, path: Path):
        self.path = path
        self.db = open_readonly(path)
        self.tables = tables(self.db, path)
        version = schema_version(self.db, self.tables)
        if version is None:
            raise TraceError(f"{path}: a rocpd database without its schema_version (rocpd_metadata)")
        if version not in KNOWN_SCHEMAS:
            raise TraceError(f"{path}: rocpd schema {version} is not one this version reads ({', '.join(KNOWN_SCHEMAS)})")
        self.version = version

    def query(self, sql: str, args: tuple = (), ncols: int = 0) -> np.ndarray:
        return query(self.db, self.path, sql, args, ncols)

    def strings(self, table: str, column: str, ids: np.ndarray) -> list[str]:
        got = lookup(self.db, f"SELECT id, {column} FROM {table} WHERE id IN ({{}})", ids)
        return [str(got.get(int(i), f"[{table} {int(i)}]")) for i in ids]

    def parts(self) -> list[tuple[int, int]]:
        """(process, GPU agent) pairs with device work, in order of first work."""
        rows = self.db.execute(
            "SELECT pid, agent, min(t0) FROM ("
            f"SELECT T.pid AS pid, coalesce(T.agent_id, -1) AS agent, DS.value AS t0 FROM rocpd_kernel_dispatch X {_TIMES}"
            + (f" UNION ALL SELECT T.pid, coalesce(T.agent_id, X.dst_agent_id, -1), DS.value FROM rocpd_memory_copy X "
               f"{_TIMES}" if "rocpd_memory_copy" in self.tables else "")
            + ") GROUP BY 1, 2 ORDER BY 3, 1, 2").fetchall()
        return int_pairs(rows, 2)  # a NULL or text pid/agent names no part

    def host(self) -> str | None:
        """The profiled node's host name (rocpd_info_node.hostname, rocprofiler-sdk's rocpd schema), where present."""
        if "rocpd_info_node" not in self.tables:
            return None
        try:
            row = self.db.execute("SELECT hostname FROM rocpd_info_node LIMIT 1").fetchone()
        except sqlite3.Error:  # an older schema without the column: the file name may still tell
            return None
        return str(row[0])[:253] if row and row[0] else None

    def env_rank(self, pid: int) -> int | None:
        if "rocpd_info_process" not in self.tables:
            return None
        row = self.db.execute("SELECT environment FROM rocpd_info_process WHERE id = ?", (pid,)).fetchone()
        try:
            env = json.loads(row[0]) if row and row[0] else {}
        except (TypeError, ValueError):
            return None
        for var in RANK_VARIABLES:
            v = env.get(var) if isinstance(env, dict) else None
            if isinstance(v, (str, int)) and str(v).isdigit():
                return int(v)
        return None


def load_databases(path: str | Path, rank_from: str | None = None):
    """One Trace per (process, GPU agent) of a rocpd database, one at a time."""
    path = Path(path)
    d = Database(path)
    yield from each_part_of(path, d, "a rocpd database without kernel dispatches or memory copies", "process={},agent={}",
                            d.env_rank, rank_from, _load_part)


def _load_part(d: Database, pid: int, agent: int, rank: int, first_of_process: bool, label: str):
    sources: list[Source] = []
    k = d.query(f"SELECT DS.value, DE.value, X.kernel_id, coalesce(T.stream_id, T.queue_id, 0), "
                f"coalesce(E.correlation_id, -1) FROM rocpd_kernel_dispatch X {_TIMES} "
                f"WHERE T.pid = ? AND coalesce(T.agent_id, -1) = ?", (pid, agent), 5)
    ids, code = codes(k[:, 2])
    sources.append(Source(k[:, 0], k[:, 1], code, d.strings("rocpd_info_kernel_symbol",
                                                            "coalesce(display_name, kernel_name)", ids),
                          "kernel", k[:, 3], k[:, 4], True))
    here = [k[:, 4]]
    if "rocpd_memory_copy" in d.tables:
        m = d.query(f"SELECT DS.value, DE.value, X.name_id, coalesce(T.stream_id, T.queue_id, 0), "
                    f"coalesce(E.correlation_id, -1) FROM rocpd_memory_copy X {_TIMES} "
                    f"WHERE T.pid = ? AND coalesce(T.agent_id, X.dst_agent_id, -1) = ?", (pid, agent), 5)
        ids, code = codes(m[:, 2])
        sources.append(Source(m[:, 0], m[:, 1], code, d.strings("rocpd_string", "string", ids), "gpu_memcpy",
                              m[:, 3], m[:, 4], True))
        here.append(m[:, 4])
    if "rocpd_region" in d.tables:
        r = d.query(f"SELECT DS.value, DE.value, X.name_id, coalesce(T.tid, 0), coalesce(E.correlation_id, -1), "
                    f"coalesce(E.category_id, -1) FROM rocpd_region X {_TIMES} WHERE T.pid = ?", (pid,), 6)
        cats = dict(zip(np.unique(r[:, 5]).tolist(), d.strings("rocpd_string", "string", np.unique(r[:, 5]))))
        runtime = np.array([str(cats.get(c, "")).upper().startswith(("HIP", "HSA")) for c in r[:, 5].tolist()], bool)
        here_ids = np.concatenate(here)
        elsewhere = d.query(f"SELECT coalesce(E.correlation_id, -1) FROM rocpd_kernel_dispatch X {_TIMES} "
                            f"WHERE T.pid = ? AND coalesce(T.agent_id, -1) != ?", (pid, agent), 1)[:, 0]
        # Annotations go with every part of the process; API calls that enqueued work, with the part
        # of that work's agent; other calls (allocation, synchronization) with the first part.
        keep = ~runtime | np.isin(r[:, 4], here_ids[here_ids > 0]) | (first_of_process & ~np.isin(r[:, 4], elsewhere))
        for mask, cat in ((runtime & keep, "cuda_runtime"), (~runtime & keep, "user_annotation")):
            sel = r[mask]
            ids, code = codes(sel[:, 2])
            sources.append(Source(sel[:, 0], sel[:, 1], code, d.strings("rocpd_string", "string", ids), cat, sel[:, 3],
                                  sel[:, 4] if cat == "cuda_runtime" else np.full(len(sel), -1, np.int64), False))
    starts = [s.start for s in sources if len(s.start)]
    zero = int(min(x.min() for x in starts)) if starts else 0
    # rocprofiler's clock is the host's monotonic ns, shared by the processes of one host: it is the
    # origin too, so that ranks of one host line up (across hosts, use --align collective-end)
    return assemble(label, rank, sources, zero, zero, d.path.stat().st_size if first_of_process else 0,
                    {"format": f"rocpd {d.version}", "process": pid, "agent": agent})
