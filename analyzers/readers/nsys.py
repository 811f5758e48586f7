"""Nsight Systems SQLite exports (`nsys export --type sqlite`) as the trace model of trace.py.

The export holds what a Kineto trace holds, in tables: kernels, copies and memsets
(CUPTI_ACTIVITY_KIND_KERNEL / MEMCPY / MEMSET, names in StringIds), the CUDA runtime calls that
launched them (CUPTI_ACTIVITY_KIND_RUNTIME, `correlationId` = Kineto's `correlation`) on host
threads, and NVTX ranges (NVTX_EVENTS: NCCL's own API ranges, engines' step ranges, torch's
`emit_nvtx` op ranges). Each becomes one event of a `Trace`, with Kineto's categories (kernel,
gpu_memcpy, gpu_memset, cuda_runtime, user_annotation), so classification, host-op links,
phases, exposure, cross-rank matching, reports and the gate run unchanged.

One export may hold several processes (an `nsys profile mpirun ...` report) and a process may
drive several GPUs: each (process, device) pair is one rank. Its rank number comes from, in
order: the `--rank-from` pattern on the file name, the rank NCCL records in its ncclCommInitRank
NVTX payload, a thread named "... rank N" (MPI and NCCL name their threads so; NVTX thread names
land in ThreadNames), `rank N` in the file name, then (host, device) / (host, pid) over the set
(cross_rank/identity.py). Set-based SQL fills numpy columns a batch at a time: no Python
object lives per event beyond the batch.

Schema versions: 2.x (Nsight 2022, EXPORT_META_DATA) and 3.x (2023 on, META_DATA_EXPORT) are
read; the columns used exist in both (checked on the shared 2.9.1 and 3.13.2 exports).
NVIDIA's description: https://docs.nvidia.com/nsight-systems/UserGuide/index.html#sqlite-schema-reference
"""

from __future__ import annotations

import bisect
import json
import re
import shutil
from functools import cached_property
from pathlib import Path

import numpy as np

from . import nvtx_payloads
from .model import INT64, Trace, TraceError, codes, factorize, int64_row
from .parts import Source, assemble, each_part_of
from .sqlite_export import int_pairs, lookup, open_readonly, query, tables

KNOWN_MAJORS = (2, 3)
_PID = "((globalPid >> 24) & 16777215)"  # Serialized GlobalId: bits 24-39 are the process id
_TPID = "((globalTid >> 24) & 16777215)"
_NVTX_TPID = "((n.globalTid >> 24) & 16777215)"  # the same, on NVTX_EVENTS aliased n
NVTX_RANGES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange (ENUM_NSYS_EVENT_TYPE)
_THREAD_RANK = re.compile(r"\brank\s*[-_#]?\s*(\d+)", re.IGNORECASE | re.ASCII)
# CUPTI memcpy kinds (ENUM_CUDA_MEMCPY_OPER in 3.x exports; fixed by CUPTI, so 2.x exports read alike)
_COPY = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH", 10: "PtoP",
         11: "HtoD (unified)", 12: "DtoH (unified)", 13: "DtoD (unified)"}
DEVICE_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


def is_export(tabs: set[str]) -> bool:
    return bool(tabs & {"META_DATA_EXPORT", "EXPORT_META_DATA"}) or "CUPTI_ACTIVITY_KIND_KERNEL" in tabs


def export_command(path: Path) -> str:
    return f"nsys export --type sqlite --include-blobs=true --output {path.with_suffix('.sqlite')} {path}"


def from_report(path: Path, out_dir: Path) -> Path:
    """An .nsys-rep exported to SQLite with the user's nsys; without nsys, the command in one line."""
    import subprocess

    nsys = shutil.which("nsys")
    if not nsys:
        raise TraceError(f"{path}: an Nsight Systems report; export it first (nsys is not on PATH here): "
                         f"{export_command(path)}")
    out = out_dir / (path.stem + ".sqlite")
    cmd = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(out), str(path)]
    # with NVTX payload blobs (NCCL's sizes and peers, nvtx_payloads.py); an nsys that does not know the option
    # exports without them, and the analysis says what they would have told
    r = subprocess.run(cmd[:3] + ["--include-blobs", "true"] + cmd[3:], capture_output=True, text=True, timeout=3600)
    if r.returncode and "include-blobs" in (r.stderr + r.stdout):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if r.returncode or not out.exists():
        last = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit {r.returncode}"]
        raise TraceError(f"{path}: nsys export failed ({last[0][:200]})")
    return out


class Export:
    """An open export, checked once: its schema version and the tables it has."""

    def __init__(self, path: Path):
        self.path = path
        self.db = open_readonly(path)
        self.tables = tables(self.db, path)
        self.version = self._version()
        if "CUPTI_ACTIVITY_KIND_KERNEL" not in self.tables and "CUPTI_ACTIVITY_KIND_RUNTIME" not in self.tables:
            raise TraceError(f"{path}: an Nsight Systems export without CUDA activity (no CUPTI_ACTIVITY_KIND_KERNEL "
                             f"or _RUNTIME table; was CUDA traced?)")
        self.strings: dict[int, object] = {}
        self._comm_ranks: dict[int, dict] = {}

    def _version(self) -> str:
        for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
            if table in self.tables:
                row = self.db.execute(f"SELECT value FROM {table} WHERE name = 'EXPORT_SCHEMA_VERSION'").fetchone()
                if row and row[0]:
                    major = str(row[0]).split(".")[0]
                    if not major.isdigit() or int(major) not in KNOWN_MAJORS:
                        raise TraceError(f"{self.path}: Nsight Systems export schema {row[0]} is not one this "
                                         f"version reads (majors {', '.join(map(str, KNOWN_MAJORS))})")
                    return str(row[0])
        raise TraceError(f"{self.path}: an SQLite database without Nsight Systems export metadata "
                         f"(META_DATA_EXPORT / EXPORT_META_DATA): not an nsys export")

    def query(self, sql: str, args: tuple = (), ncols: int = 0) -> np.ndarray:
        return query(self.db, self.path, sql, args, ncols)

    def string_values(self, ids: np.ndarray) -> list[str]:
        """The StringIds values of `ids`, in order (each id asked of the database once per export)."""
        self.strings.update(lookup(self.db, "SELECT id, value FROM StringIds WHERE id IN ({})",
                                   (i for i in np.unique(ids).tolist() if i not in self.strings)))
        return [str(self.strings.get(int(i), f"[string {int(i)}]")) for i in ids]

    def parts(self) -> list[tuple[int, int]]:
        """(process id, device id) pairs with device activity, in order of first activity."""
        sel = [f"SELECT {_PID} AS pid, deviceId, min(start) AS t0 FROM {t} GROUP BY 1, 2"
               for t in DEVICE_TABLES if t in self.tables]
        rows = (self.db.execute(f"SELECT pid, deviceId, min(t0) FROM ({' UNION ALL '.join(sel)}) GROUP BY 1, 2 "
                                "ORDER BY 3, 1, 2").fetchall() if sel else [])
        if not rows and "CUPTI_ACTIVITY_KIND_RUNTIME" in self.tables:  # CUDA calls, no device work recorded
            rows = self.db.execute(f"SELECT {_TPID}, -1, min(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY 1 "
                                   "ORDER BY 3").fetchall()
        return int_pairs(rows, 2)  # a NULL or text pid/device names no part

    def own_rank(self, pid: int) -> int | None:
        """The process's rank as it records it: NCCL's own word first (the payload of its
        ncclCommInitRank NVTX range), else a thread's name."""
        r = self.nccl_rank(pid)
        return r if r is not None else self.thread_rank(pid)

    @cached_property
    def nvtx_columns(self) -> set[str]:
        """NVTX_EVENTS' columns (the payload's JSON text is in newer schemas only), asked once."""
        return {r[1] for r in self.db.execute("PRAGMA table_info(NVTX_EVENTS)")} if "NVTX_EVENTS" in self.tables else set()

    @cached_property
    def blobs_flag(self) -> str | None:
        """The export's EXPORT_PARAM_INCLUDE_BLOBS (nvtx_payloads.export_flag), asked once."""
        return nvtx_payloads.export_flag(self.db, self.tables)

    @cached_property
    def payload_schemas(self) -> dict:
        """NVTX payload schemas (nvtx_payloads.schemas), where the export may hold blobs to decode with
        them: a binaryData column, and not exported with EXPORT_PARAM_INCLUDE_BLOBS false (so an export
        without blobs costs no query of its NVTX rows beyond the one every export has)."""
        if "binaryData" not in self.nvtx_columns or self.blobs_flag == "false":
            return {}
        return nvtx_payloads.schemas(self.db, self.tables)

    def nccl_rows(self, pid: int, like: str) -> list[tuple]:
        """(start, end, globalTid, name, blob) of this process's ranges whose name is LIKE `like`, in
        (thread, start) order; the blob None where the export has none."""
        blob = "n.binaryData" if self.payload_schemas else "NULL"
        text = "coalesce(n.text, s.value, '')"
        rows = self.db.execute(
            f"SELECT n.start, n.end, n.globalTid, {text}, {blob} FROM NVTX_EVENTS n LEFT JOIN StringIds s "
            f"ON s.id = n.textId WHERE {text} LIKE ? AND {_NVTX_TPID} = ? AND n.end IS NOT NULL "
            "ORDER BY n.globalTid, n.start LIMIT 10000000", (like, pid)).fetchall()
        return [r for r in rows if int64_row(r[:3])]

    def comm_ranks(self, pid: int) -> dict:
        """This process's rank and size in each communicator (nvtx_payloads.comm_ranks) from its
        ncclCommInitRank payloads, decoded once per process (the rank rules and the reader both ask);
        {} without blobs."""
        if pid not in self._comm_ranks:
            self._comm_ranks[pid] = nvtx_payloads.comm_ranks(
                [(r[3], r[4]) for r in self.nccl_rows(pid, nvtx_payloads.INIT_PREFIX + "%")],
                self.payload_schemas) if self.payload_schemas else {}
        return self._comm_ranks[pid]

    def nccl_rank(self, pid: int) -> int | None:
        """The rank NCCL gave this process in its largest communicator (the world's): the "Rank" and
        "No. of ranks" entries of the ncclCommInitRank range's NVTX payload (NVIDIA/nccl
        src/include/nvtx_payload_schemas.h): from its blob (`nsys export --include-blobs=true`), else
        from the range's JSON text (`--include-json=true`; a shape no real export has shown yet). None
        where the export has no payloads, or the largest communicator gives this process two ranks (one
        process driving several devices: each part's rank is told apart by the rules after)."""
        cols = self.nvtx_columns
        if None in (ranks := self.comm_ranks(pid)):
            return ranks[None][0]
        if not {"jsonText", "jsonTextId"} & cols:
            return None
        js = ("coalesce(n.jsonText, j.value)" if {"jsonText", "jsonTextId"} <= cols
              else "n.jsonText" if "jsonText" in cols else "j.value")
        rows = self.db.execute(
            f"SELECT {js} FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
            + ("LEFT JOIN StringIds j ON j.id = n.jsonTextId " if "jsonTextId" in cols else "")
            + f"WHERE coalesce(n.text, s.value, '') LIKE 'ncclCommInitRank%' AND {_NVTX_TPID} = ? "
            "LIMIT 10000", (pid,)).fetchall()
        best: dict[int, set[int]] = {}
        for (text,) in rows:
            try:
                doc = json.loads(text) if isinstance(text, str) and len(text) < 65536 else None
            except (ValueError, RecursionError):
                continue
            if isinstance(doc, dict):
                rank, n = doc.get("Rank"), doc.get("No. of ranks")
                if all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 24 for v in (rank, n)):
                    best.setdefault(n, set()).add(rank)
        if not best:
            return None
        ranks = best[max(best)]
        return ranks.pop() if len(ranks) == 1 else None

    def thread_rank(self, pid: int) -> int | None:
        """A rank from the process's thread names ("MPI Rank 3", NVTX-named threads), else None."""
        if "ThreadNames" not in self.tables:
            return None
        names = self.db.execute(f"SELECT s.value FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId "
                                f"WHERE {_TPID} = ?", (pid,)).fetchall()
        found = {int(m.group(1)) for (n,) in names if (m := _THREAD_RANK.search(n or ""))}
        return found.pop() if len(found) == 1 else None

    def host(self) -> str | None:
        """The profiled machine's host name (TARGET_INFO_SYSTEM_ENV 'Hostname'), where the export records it."""
        if "TARGET_INFO_SYSTEM_ENV" not in self.tables:
            return None
        row = self.db.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname' LIMIT 1").fetchone()
        return str(row[0])[:253] if row and row[0] else None

    def origin_ns(self) -> int:
        if "TARGET_INFO_SESSION_START_TIME" in self.tables:
            row = self.db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
            if row and type(row[0]) is int and 0 <= row[0] < INT64[1]:
                return row[0]
        return 0


def load_exports(path: str | Path, rank_from: str | None = None):
    """One Trace per (process, device) of an export, one at a time."""
    path = Path(path)
    ex = Export(path)
    yield from each_part_of(path, ex, "an Nsight Systems export without CUDA kernels, copies or runtime calls",
                            "pid={},device={}", ex.own_rank, rank_from, _load_part,
                            device_index=lambda pid, dev: dev if dev >= 0 else None)


def _load_part(ex: Export, pid: int, dev: int, rank: int, first_of_process: bool, label: str):
    sources: list[Source] = []
    where = f"{_PID} = ? AND deviceId = ?"
    corr_here = [np.zeros(0, np.int64)]
    if "CUPTI_ACTIVITY_KIND_KERNEL" in ex.tables:
        k = ex.query(f"SELECT start, end, demangledName, streamId, coalesce(correlationId, -1) "
                     f"FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE {where}", (pid, dev), 5)
        ids, code = codes(k[:, 2])
        sources.append(Source(k[:, 0], k[:, 1], code, ex.string_values(ids), "kernel", k[:, 3], k[:, 4], True))
        corr_here.append(k[:, 4])
    for table, cat in (("CUPTI_ACTIVITY_KIND_MEMCPY", "gpu_memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "gpu_memset")):
        if table in ex.tables:
            kind = "copyKind" if cat == "gpu_memcpy" else "0"
            m = ex.query(f"SELECT start, end, {kind}, streamId, coalesce(correlationId, -1) FROM {table} WHERE {where}",
                         (pid, dev), 5)
            kinds, code = codes(m[:, 2])
            names = [f"Memcpy {_COPY.get(c, f'kind {c}')}" if cat == "gpu_memcpy" else "Memset (Device)"
                     for c in kinds.tolist()]
            sources.append(Source(m[:, 0], m[:, 1], code, names, cat, m[:, 3], m[:, 4], True))
            corr_here.append(m[:, 4])
    runtime, rows = np.zeros((0, 5), np.int64), []
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in ex.tables:
        r = ex.query(f"SELECT start, end, nameId, globalTid, coalesce(correlationId, -1) FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                     f"WHERE {_TPID} = ?", (pid,), 5)
        r = r[np.lexsort((r[:, 0], r[:, 4]))]  # by correlation id, then start (numpy sorts faster than SQLite)
        # Nsight 2022 (schema 2.x) writes some calls twice with one correlation id ("cudaLaunchKernel"
        # and "cudaLaunchKernel_v7000"): keep the first-starting (the outer) one of each id.
        dup = np.zeros(len(r), bool)
        dup[1:] = (r[1:, 4] == r[:-1, 4]) & (r[1:, 4] > 0)
        r = r[~dup]
        # A process driving several devices: calls that launched work go with that work's device,
        # the others (cudaMalloc, synchronization) with the process's first part.
        here = np.concatenate(corr_here)
        others = [f"SELECT correlationId FROM {t} WHERE {_PID} = ? AND deviceId != ? AND correlationId > 0"
                  for t in DEVICE_TABLES if t in ex.tables]
        elsewhere = ex.query(" UNION ALL ".join(others), (pid, dev) * len(others), 1)[:, 0] if others else here[:0]
        keep = np.isin(r[:, 4], here[here > 0]) | (first_of_process & ~np.isin(r[:, 4], elsewhere))
        r = r[keep]
        ids, code = codes(r[:, 2])
        sources.append(Source(r[:, 0], r[:, 1], code, ex.string_values(ids), "cuda_runtime", r[:, 3], r[:, 4], False))
        runtime = r
    if "NVTX_EVENTS" in ex.tables:
        rows = ex.db.execute(
            f"SELECT n.start, n.end, n.globalTid, coalesce(n.text, s.value, '') FROM NVTX_EVENTS n "
            f"LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType IN ({','.join(map(str, NVTX_RANGES))}) "
            f"AND n.end IS NOT NULL AND {_NVTX_TPID} = ?", (pid,)).fetchall()
        rows = [r for r in rows if int64_row(r[:3])]  # start, end, thread checked, as query() does
        if rows:
            starts, ends, tids, texts = zip(*rows)
            code, names = factorize(list(texts))
            sources.append(Source(np.array(starts, np.int64), np.array(ends, np.int64), code, [str(x) for x in names],
                                  "user_annotation", np.array(tids, np.int64), np.full(len(rows), -1, np.int64), False))
    trace = assemble(label, rank, sources, 0, ex.origin_ns(), ex.path.stat().st_size if first_of_process else 0,
                     {"format": f"nsys-sqlite {ex.version}", "pid": pid, "device": dev})
    if "NVTX_EVENTS" in ex.tables:
        _nccl_payloads(ex, pid, trace, rows, runtime)
    return trace


_A2A_RANGES = ("nccl:all_to_all", "c10d::alltoall")  # torch's record_function names around an all-to-all


def _nccl_payloads(ex: Export, pid: int, trace: Trace, nvtx: list[tuple], runtime: np.ndarray) -> None:
    """What NCCL's NVTX payloads (nvtx_payloads.py) say of this part's calls: each grouped
    send/receive's per-peer bytes on the call's events, the kernel its ncclGroupEnd launched and the
    torch all-to-all ranges around it (Trace.a2a_args, what per_rank/traffic.py reads); each kernel's
    communicator as its process group (args "Process Group Name", and "Group size" where the
    communicator's ncclCommInitRank is in the export), so calls of different communicators are never
    matched as one; where the export holds no sizes, why (extra["a2a_sizes_missing"])."""
    if ex.payload_schemas:  # the blobs too: one more query of this process's NCCL ranges
        rows = ex.nccl_rows(pid, "nccl%")
    else:  # the ranges already read, in (thread, start) order
        rows = sorted(((s, e, t, n, None) for s, e, t, n in nvtx if n in nvtx_payloads.GROUP_NAMES),
                      key=lambda r: (r[2], r[0]))
    sends = sum(1 for r in rows if r[3] in ("ncclSend", "ncclRecv", *nvtx_payloads.ALLTOALL_NAMES))
    gs, got, ranks = [], [], {}
    if any(r[4] is not None for r in rows):
        ranks = ex.comm_ranks(pid)
        gs = nvtx_payloads.groups(rows, ex.payload_schemas)
        got = nvtx_payloads.splits(gs, ranks)
    why = nvtx_payloads.missing_reason(ex.blobs_flag, "binaryData" in ex.nvtx_columns, sends, len(got),
                                       any(isinstance(n, str) and n.startswith("nccl") and not n.startswith("nccl:")
                                           for *_, n in nvtx))
    if why:
        trace.extra["a2a_sizes_missing"] = why
    if not gs:
        return
    dev = trace.is_device()
    kernels = {int(trace.arg_corr[i]): i for i in np.flatnonzero(dev & (trace.arg_corr > 0)).tolist()}
    runtime = runtime[np.lexsort((runtime[:, 0], runtime[:, 3]))] if len(runtime) else runtime  # by thread, start
    threads, first = np.unique(runtime[:, 3], return_index=True) if len(runtime) else (runtime[:0, 0], runtime[:0, 0])
    bounds = dict(zip(threads.tolist(), zip(first.tolist(), np.r_[first[1:], len(runtime)].tolist())))

    def launched(g) -> list[int]:
        """The kernels whose launch lies inside the group's ncclGroupEnd (its own range, ungrouped)."""
        lo, hi = bounds.get(g.tid, (0, 0))
        r = runtime[lo:hi]
        a, b = np.searchsorted(r[:, 0], g.end_start, "left"), np.searchsorted(r[:, 0], g.end, "right")
        return [i for c in r[a:b][r[a:b, 1] <= g.end, 4].tolist() if (i := kernels.get(int(c))) is not None]

    # a communicator's size: its ncclCommInitRank's, else the peers its sends and receives name (an
    # all-to-all names every peer it sends anything); unknown otherwise, and its calls are then matched
    # only where every rank present holds them
    size = {c: n for c, (_, n) in ranks.items() if c is not None}
    for g in gs:
        if g.comm is not None and g.comm not in ranks and (g.send or g.recv):
            size[g.comm] = max(size.get(g.comm, 0), 1 + max((*g.send, *g.recv)))
    names: dict[int, int] = {}  # communicator -> its args row
    for g in gs:
        if g.comm is None or not 0 <= g.comm < 1 << 64:
            continue
        if g.comm not in names:
            names[g.comm] = len(trace.arg_dicts)
            trace.arg_dicts.append({"Process Group Name": f"nccl comm 0x{g.comm:016x}",
                                    **({"Group size": size[g.comm]} if g.comm in size else {})})
        for i in launched(g):
            trace.arg_row[i] = names[g.comm]
    at: dict[float, list[int]] = {}  # host events by start (µs, as assemble computed it)
    for i in np.flatnonzero(~dev).tolist():
        at.setdefault(float(trace.ts[i]), []).append(i)
    ranges: dict[int, list[tuple]] = {}  # per thread, torch's all-to-all ranges by start
    for s, e, t, n in sorted(nvtx):
        if isinstance(n, str) and n.startswith(_A2A_RANGES):
            ranges.setdefault(t, []).append((s, e, n))
    starts = {t: [x[0] for x in v] for t, v in ranges.items()}
    for g, args in got:
        for i in launched(g):
            trace.a2a_args[i] = args
        j = bisect.bisect_right(starts.get(g.tid, []), g.start)
        for s, e, n in ranges.get(g.tid, [])[max(0, j - 4):j]:  # the few nested ranges just before it
            if e >= g.end:
                for i in at.get(s / 1000.0, []):
                    if trace.names[trace.name_id[i]] == n:
                        trace.a2a_args[i] = args
