"""RPD files (rocmProfileData's SQLite: what `rpd_tracer`, vLLM-on-ROCm's and raptor's users hand
around) as the trace model.

Written from ROCm/rocmProfileData's sources (rpd_tracer/RoctracerDataSource.cpp,
RoctxDataSource.cpp, Logger.cpp; docs/perf_playbooks/rpd-tables.md) and checked on a real file
(../shared/traces/amd/rpd_vllm_mi300_mytrace.rpd.gz, schema_version 2):
- `rocpd_op`: device work (gpuId, queueId, start/end in ns of CLOCK_MONOTONIC, `description_id`
  the kernel name for kernels and graph-launched "Task" ops, '' for copies, `opType_id` the
  roctracer op string: KernelExecution, Task, CopyHostToDevice, ...). Barriers are not logged.
- `rocpd_api`: host calls (pid, tid, start/end, `apiName_id`, `args_id`): HIP calls by name
  (hipLaunchKernel, hipGraphLaunch, ...); roctx ranges and PyTorch ops as `UserMarker` with the
  text in args; `rpdTracerControl.rangePush` ranges under their own name; and the tracer's own
  overhead records (`OVERHEAD`), which are dropped.
- `rocpd_api_ops`: the API call that enqueued each op: the launch correlation.
- `ext_autogradapi` (where rpd's autograd post-processing ran): which UserMarker rows are PyTorch
  ops (`cpu_op`; other ranges are annotations).
Each (process, GPU) pair is one rank (the rank rule of parts.py: --rank-from, else `rank N` in
the file name, else the order of first work). RPD has no RCCL API records: a RCCL kernel
(`ncclDevKernel_Generic`, which names no collective) takes its collective from the PyTorch op
around its launch, as in a Kineto trace.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from .model import TraceError, codes
from .parts import Source, assemble, each_part_of
from .sqlite_export import lookup, open_readonly, query, schema_version, tables

RPD_TABLES = frozenset({"rocpd_op", "rocpd_api", "rocpd_api_ops", "rocpd_string"})
KNOWN_SCHEMAS = ("2",)  # rocpd_metadata schema_version; files without metadata are read as the same layout
# createOverheadRecord's names in rpd_tracer (ApiTable.cpp, Logger.cpp, RoctracerDataSource.cpp, ...)
OVERHEAD = re.compile(r"::writeRows$|^(BLOCKING|rpdflush|hcc_activity_callback|overhead \(hip\)|prepare|commit|"
                      r"RocprofDataSource::buffer_callback)$")
_OP_NAME = re.compile(r"[A-Za-z_]\w*::\w")
_OPS = ("FROM rocpd_op O LEFT JOIN (SELECT op_id, min(api_id) AS api_id FROM rocpd_api_ops GROUP BY op_id) AO "
        "ON AO.op_id = O.id LEFT JOIN rocpd_api A ON A.id = AO.api_id")


def is_rpd(tabs: set[str]) -> bool:
    return RPD_TABLES <= tabs and "rocpd_kernel_dispatch" not in tabs  # the latter: rocprofv3's rocpd


def _device_cat(op_type: str) -> str | None:
    if op_type.startswith("Copy"):
        return "gpu_memcpy"
    if "Fill" in op_type or "Memset" in op_type:
        return "gpu_memset"
    if op_type in ("Barrier", "Marker"):  # not work (rpd skips barriers; older files may not)
        return None
    return "kernel"


def _runtime(name: str) -> bool:
    return name.startswith(("hip", "hsa", "__hip"))


class File:
    def __init__(self, path: Path):
        self.path = path
        self.db = open_readonly(path)
        self.tables = tables(self.db, path)
        version = schema_version(self.db, self.tables)
        self.version = "unversioned" if version is None else version
        if version is not None and version not in KNOWN_SCHEMAS:
            raise TraceError(f"{path}: RPD schema {self.version} is not one this version reads ({', '.join(KNOWN_SCHEMAS)})")
        self.empty = self._one("SELECT id FROM rocpd_string WHERE string = ''", -1)
        self.only_pid = self._only_pid()

    def _one(self, sql: str, default):
        try:
            row = self.db.execute(sql).fetchone()
        except Exception as e:  # sqlite3.DatabaseError: a truncated file
            from .sqlite_export import why

            raise TraceError(f"{self.path}: {why(e)}") from None
        return row[0] if row and row[0] is not None else default

    def _only_pid(self) -> int:
        pids = self.query("SELECT DISTINCT pid FROM rocpd_api", ncols=1)[:, 0]
        return int(pids[0]) if len(pids) == 1 else -1

    def query(self, sql: str, args: tuple = (), ncols: int = 0) -> np.ndarray:
        return query(self.db, self.path, sql, args, ncols)

    def strings(self, ids) -> list[str]:
        got = lookup(self.db, "SELECT id, string FROM rocpd_string WHERE id IN ({})", ids)
        return [str(got.get(int(i), f"[rocpd_string {int(i)}]")) for i in ids]

    def parts(self) -> list[tuple[int, int]]:
        """(process, GPU) pairs with device work, in order of first work. An op no API call
        enqueued belongs to the file's one process where it has one."""
        rows = self.query(f"SELECT coalesce(A.pid, ?), O.gpuId, min(O.start) {_OPS} GROUP BY 1, 2 ORDER BY 3, 1, 2",
                          (self.only_pid,), 3)
        return [(int(p), int(g)) for p, g, _ in rows]

    def autograd_ids(self) -> np.ndarray:
        if "ext_autogradapi" not in self.tables:
            return np.zeros(0, np.int64)
        return self.query("SELECT api_ptr_id FROM ext_autogradapi", ncols=1)[:, 0]


def load_files(path: str | Path, rank_from: str | None = None):
    """One Trace per (process, GPU) of an RPD file, one at a time."""
    path = Path(path)
    yield from each_part_of(path, File(path), "an RPD file without device work (rocpd_op is empty)", "process={},gpu={}",
                            lambda pid: None, rank_from, _load_part)


def _load_part(f: File, pid: int, gpu: int, rank: int, first_of_process: bool, label: str):
    o = f.query(f"SELECT O.start, O.end, O.description_id, O.opType_id, O.queueId, coalesce(AO.api_id, -1) {_OPS} "
                f"WHERE coalesce(A.pid, ?) = ? AND O.gpuId = ?", (f.only_pid, pid, gpu), 6)
    types, which = codes(o[:, 3])
    cat_of = np.array([_device_cat(t) or "" for t in f.strings(types)], object)[which]
    name = np.where(o[:, 2] == f.empty, o[:, 3], o[:, 2])  # copies have no description: their op type names them
    sources = []
    for cat in sorted(set(cat_of.tolist()) - {""}):
        sel = cat_of == cat
        ids, code = codes(name[sel])
        sources.append(Source(o[sel, 0], o[sel, 1], code, f.strings(ids), cat, o[sel, 4], o[sel, 5], True))
    a = f.query("SELECT start, end, apiName_id, args_id, tid, id FROM rocpd_api WHERE pid = ? AND end >= start",
                (pid,), 6)
    api_ids, api_code = codes(a[:, 2])
    api_names = f.strings(api_ids)
    runtime = np.array([_runtime(n) for n in api_names], bool)[api_code]
    marker = np.array([n == "UserMarker" for n in api_names], bool)[api_code]
    overhead = np.array([bool(OVERHEAD.search(n)) for n in api_names], bool)[api_code] & ~runtime
    if runtime.any():
        launched_here = o[:, 5][o[:, 5] >= 0]
        elsewhere = f.query(f"SELECT AO.api_id {_OPS} WHERE AO.api_id IS NOT NULL AND O.gpuId != ?", (gpu,), 1)[:, 0]
        # calls that enqueued work go with that work's GPU; other calls (sync, allocation) with the first part
        keep = runtime & (np.isin(a[:, 5], launched_here) | (first_of_process & ~np.isin(a[:, 5], elsewhere)))
        ids, code = codes(a[keep, 2])
        sources.append(Source(a[keep, 0], a[keep, 1], code, f.strings(ids), "cuda_runtime", a[keep, 4], a[keep, 5],
                              False))
    ann = ~runtime & ~overhead
    sel = a[ann]
    ids, code = codes(np.where(marker, a[:, 3], a[:, 2])[ann])  # UserMarker: the range's text; rangePush: its name
    names = f.strings(ids)
    # PyTorch ops: rows of the autograd table, or (no table) names such as aten::mm, c10d::allreduce_
    op = np.array([bool(_OP_NAME.match(n)) for n in names], bool)[code] | np.isin(sel[:, 5], f.autograd_ids())
    for cat, m in (("cpu_op", op), ("user_annotation", ~op)):
        sources.append(Source(sel[m, 0], sel[m, 1], code[m], names, cat, sel[m, 4], np.full(int(m.sum()), -1, np.int64),
                              False))
    starts = [s.start for s in sources if len(s.start)]
    zero = int(min(x.min() for x in starts)) if starts else 0
    # CLOCK_MONOTONIC ns, shared by the processes of one host: the origin too, so that ranks of
    # one host line up (across hosts, --align collective-end)
    return assemble(label, rank, sources, zero, zero, f.path.stat().st_size if first_of_process else 0,
                    {"format": f"rpd {f.version}", "process": pid, "gpu": gpu,
                     "tracer_records_dropped": int(overhead.sum())})
