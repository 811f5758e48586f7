"""rocprofv3's JSON output (`rocprofv3 --output-format json`: `%hostname%/%pid%_results.json`) as
the trace model.

Written from ROCm/rocprofiler-sdk's writer (source/lib/output/generateJSON.cpp: a top-level
`rocprofiler-sdk-tool` list, one entry per process with `metadata` (pid), `agents`, `strings`,
`kernel_symbols` and `buffer_records`) and the record types of its public headers
(rocprofiler-sdk/buffer_tracing.h), checked on a real file
(../shared/traces/amd/rocprofv3_mi350_pid908_results.json.gz):
- `buffer_records.kernel_dispatch`: start/end_timestamp (ns), `dispatch_info` (agent_id, queue_id,
  kernel_id into `kernel_symbols`), `correlation_id.internal`, thread_id;
- `memory_copy`: the same times, src/dst_agent_id, `operation` named by
  `strings.buffer_records[kind].operations` (MEMORY_COPY_DEVICE_TO_HOST, ...);
- `hip_api`, `hsa_api`: host runtime calls (`cuda_runtime`, correlation ids as Kineto's);
  `rccl_api` (ncclAllReduce, ...) and `marker_api` (roctx ranges, their text in
  `strings.marker_api` by correlation id): host annotations, engine steps among them.
Each (process, GPU agent) pair is one rank (the rank rule of parts.py). A file with dispatches
only (no API records, as the shared one) is attributed by kernel name alone, and says so: no
kernel can be linked to a launch.

Decoded with msgspec into typed records (the fields read here only), so memory follows the
records kept, not the JSON's many other fields; the uncompressed size is bounded like a Kineto
trace decoded whole (limits.py).
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np

from .limits import read_bytes
from .model import TraceError, codes, int64_row
from .parts import Source, assemble, each_part

TOOL_KEY = "rocprofiler-sdk-tool"
GPU = 2  # rocprofiler_agent_type_t: ROCPROFILER_AGENT_TYPE_GPU


def is_rocprof_json(head: bytes) -> bool:
    """Whether the start of a (decompressed) JSON file is rocprofv3's: its one top-level key."""
    return f'"{TOOL_KEY}"'.encode() in head[:4096]


class _Handle(msgspec.Struct, frozen=True):
    handle: int = 0


class _Corr(msgspec.Struct, frozen=True):
    internal: int = 0


class _DispatchInfo(msgspec.Struct):
    agent_id: _Handle
    kernel_id: int
    queue_id: _Handle = _Handle()


class _Dispatch(msgspec.Struct):
    start_timestamp: int
    end_timestamp: int
    dispatch_info: _DispatchInfo
    correlation_id: _Corr = _Corr()


class _Copy(msgspec.Struct):
    kind: int
    operation: int
    start_timestamp: int
    end_timestamp: int
    dst_agent_id: _Handle = _Handle()
    src_agent_id: _Handle = _Handle()
    correlation_id: _Corr = _Corr()


class _Api(msgspec.Struct):
    kind: int
    operation: int
    start_timestamp: int
    end_timestamp: int
    thread_id: int = 0
    correlation_id: _Corr = _Corr()


class _Records(msgspec.Struct):
    kernel_dispatch: list[_Dispatch] = []
    memory_copy: list[_Copy] = []
    hip_api: list[_Api] = []
    hsa_api: list[_Api] = []
    rccl_api: list[_Api] = []
    marker_api: list[_Api] = []


class _Names(msgspec.Struct):
    kind: str = ""
    operations: list[str] = []


class _Message(msgspec.Struct):
    key: int
    value: str


class _Strings(msgspec.Struct):
    buffer_records: list[_Names]
    marker_api: list[_Message] = []


class _Symbol(msgspec.Struct):
    kernel_id: int
    formatted_kernel_name: str = ""
    demangled_kernel_name: str = ""
    kernel_name: str = ""


class _Agent(msgspec.Struct):
    id: _Handle
    type: int
    logical_node_type_id: int = -1


class _Metadata(msgspec.Struct):
    pid: int


class _Process(msgspec.Struct):
    metadata: _Metadata
    agents: list[_Agent]
    strings: _Strings
    kernel_symbols: list[_Symbol]
    buffer_records: _Records


class _Doc(msgspec.Struct):
    tool: list[_Process] = msgspec.field(name=TOOL_KEY)


def _decode(path: Path) -> tuple[_Doc, int, dict[str, int]]:
    data = read_bytes(path)
    try:
        return msgspec.json.decode(data, type=_Doc), len(data), {}
    except RecursionError:
        raise TraceError(f"{path}: JSON nested too deeply to read") from None
    except msgspec.ValidationError:
        pass  # some record is not as rocprofv3 writes it: read the file record by record
    except msgspec.DecodeError as e:
        raise TraceError(f"{path}: not valid JSON ({e})") from None
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise TraceError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise TraceError(f"{path}: JSON nested too deeply to read") from None
    doc, skipped = _lenient(path, raw)
    return doc, len(data), skipped


_RECORD_TYPES = {"kernel_dispatch": _Dispatch, "memory_copy": _Copy, "hip_api": _Api, "hsa_api": _Api, "rccl_api": _Api,
                 "marker_api": _Api}


def _lenient(path: Path, raw) -> tuple[_Doc, dict[str, int]]:
    """The checked boundary for a file whose typed decode failed: each process's parts and each
    record converted on its own; a record of the wrong shape (a string for a timestamp, a missing
    field, an integer beyond int64) is skipped and counted per list, so the rest still stands. A
    process without what every part needs (its pid, agents, strings, symbols) is refused."""
    procs = raw.get(TOOL_KEY) if isinstance(raw, dict) else None
    if not isinstance(procs, list):
        raise TraceError(f"{path}: a rocprofv3 JSON file without its {TOOL_KEY} list of processes")
    skipped: dict[str, int] = {}

    def each(items, typ, where: str) -> list:
        out = []
        for x in items if isinstance(items, list) else []:
            try:
                out.append(msgspec.convert(x, type=typ))
            except (msgspec.ValidationError, TypeError, ValueError, OverflowError):
                skipped[where] = skipped.get(where, 0) + 1
        if not isinstance(items, list):  # the whole section missing, or not a list
            skipped[f"{where} section"] = 1
        return out

    out = []
    for i, pr in enumerate(procs):
        if not isinstance(pr, dict):
            skipped["processes"] = skipped.get("processes", 0) + 1
            continue
        try:
            meta = msgspec.convert(pr.get("metadata"), type=_Metadata)
        except (msgspec.ValidationError, TypeError, ValueError, OverflowError) as e:
            raise TraceError(f"{path}: process {i} of the rocprofv3 JSON lacks its metadata ({e})") from None
        st = pr.get("strings") if isinstance(pr.get("strings"), dict) else {}
        names = []
        for n in st.get("buffer_records") if isinstance(st.get("buffer_records"), list) else []:
            n = n if isinstance(n, dict) else {}
            ops = n.get("operations") if isinstance(n.get("operations"), list) else []
            # a name of the wrong type is named by its place, as an id missing from the table is
            names.append(_Names(n["kind"] if isinstance(n.get("kind"), str) else "",
                                [o if isinstance(o, str) else f"[operation {j}]" for j, o in enumerate(ops)]))
        strings = _Strings(names, each(st.get("marker_api"), _Message, "strings.marker_api"))
        br = pr.get("buffer_records") if isinstance(pr.get("buffer_records"), dict) else {}
        records = _Records(**{name: each(br.get(name), typ, name) for name, typ in _RECORD_TYPES.items() if name in br})
        out.append(_Process(meta, each(pr.get("agents"), _Agent, "agents"), strings,
                            each(pr.get("kernel_symbols"), _Symbol, "kernel_symbols"), records))
    return _Doc(out), skipped


def load_json(path: str | Path, rank_from: str | None = None):
    """One Trace per (process, GPU agent) of a rocprofv3 JSON file, one at a time."""
    path = Path(path)
    doc, nbytes, skipped = _decode(path)
    notes = [f"{path.name}: no readable {where[:-8]} section" if where.endswith(" section") else
             f"{path.name}: {n} {where} record(s) skipped: not as rocprofv3 writes them" for where, n in skipped.items()]
    procs = {p.metadata.pid: _Columns(p) for p in doc.tool}
    del doc  # the records live on as columns only
    parts = []
    for pid, c in procs.items():
        for agent in np.unique(np.concatenate([c.kernel[:, 5], c.copy[:, 4]])).tolist():
            mine = np.concatenate([c.kernel[c.kernel[:, 5] == agent, 0], c.copy[c.copy[:, 4] == agent, 0]])
            parts.append((int(mine.min()), pid, agent))
    if not parts:
        raise TraceError(f"{path}: a rocprofv3 JSON file without kernel dispatches or memory copies")
    parts = [(pid, h) for _, pid, h in sorted(parts)]
    for t in each_part(path, parts, "process={},agent={}", lambda pid: None, rank_from,
                       lambda pid, agent, rank, first, label: procs[pid].part(agent, first, rank, label, nbytes)):
        t.extra.setdefault("notes", []).extend(notes)
        yield t


class _Columns:
    """One process's records as int64 columns (one tuple per record, no per-field calls), and the
    names they refer to: built once, then cut per GPU agent."""

    def __init__(self, p: _Process):
        br = p.buffer_records
        self.pid = p.metadata.pid
        self.agents = p.agents
        self.names = p.strings.buffer_records
        self.symbols = {s.kernel_id: s.formatted_kernel_name or s.demangled_kernel_name or s.kernel_name
                        for s in p.kernel_symbols}
        self.messages = {m.key: m.value for m in p.strings.marker_api}
        gpus = {a.id.handle for a in p.agents if a.type == GPU}
        # start, end, kernel_id, queue, correlation, agent
        self.kernel = _array([(d.start_timestamp, d.end_timestamp, d.dispatch_info.kernel_id,
                               d.dispatch_info.queue_id.handle, d.correlation_id.internal, d.dispatch_info.agent_id.handle)
                              for d in br.kernel_dispatch], 6)
        # start, end, kind/operation, correlation, the GPU agent it belongs to (destination, else source)
        self.copy = _array([(c.start_timestamp, c.end_timestamp, c.kind * _OPS + c.operation, c.correlation_id.internal,
                             c.dst_agent_id.handle if c.dst_agent_id.handle in gpus else c.src_agent_id.handle)
                            for c in br.memory_copy], 5)
        # start, end, kind/operation, thread, correlation
        self.api = {cat: _array([(r.start_timestamp, r.end_timestamp, r.kind * _OPS + r.operation, r.thread_id,
                                  r.correlation_id.internal) for r in recs], 5)
                    for cat, recs in (("runtime", br.hip_api + br.hsa_api), ("rccl", br.rccl_api),
                                      ("marker", br.marker_api))}
        self.launches = bool(br.hip_api or br.hsa_api)
        self.unknown = 0

    def op_name(self, code: int) -> str:
        kind, op = divmod(int(code), _OPS)
        if 0 <= kind < len(self.names) and 0 <= op < len(self.names[kind].operations):
            return self.names[kind].operations[op]
        self.unknown += 1
        return f"[kind {kind} operation {op}]"

    def part(self, agent: int, first_of_process: bool, rank: int, label: str, nbytes: int):
        self.unknown = 0
        sources: list[Source] = []
        k = self.kernel[self.kernel[:, 5] == agent]
        ids, code = codes(k[:, 2])
        self.unknown += sum(int(i) not in self.symbols for i in ids)
        sources.append(Source(k[:, 0], k[:, 1], code, [self.symbols.get(int(i), f"[kernel_id {int(i)}]") for i in ids],
                              "kernel", k[:, 3], k[:, 4], True))
        m = self.copy[self.copy[:, 4] == agent]
        ids, code = codes(m[:, 2])
        sources.append(Source(m[:, 0], m[:, 1], code, [self.op_name(i) for i in ids], "gpu_memcpy",
                              np.zeros(len(m), np.int64), m[:, 3], True))
        here = np.concatenate([k[:, 4], m[:, 3]])
        elsewhere = self.kernel[self.kernel[:, 5] != agent, 4]
        for kind, cols in self.api.items():
            if kind == "runtime":  # calls that enqueued work go with its agent; the others with the first part
                keep = np.isin(cols[:, 4], here[here > 0]) | (first_of_process & ~np.isin(cols[:, 4], elsewhere))
                cols = cols[keep]
            if kind == "marker":  # a range's text, by its correlation id
                ids, code = codes(cols[:, 4])
                label_of = [self.messages.get(int(c)) or "roctx range" for c in ids]
            else:
                ids, code = codes(cols[:, 2])
                label_of = [self.op_name(i) for i in ids]
            runtime = kind == "runtime"
            sources.append(Source(cols[:, 0], cols[:, 1], code, label_of, "cuda_runtime" if runtime else "user_annotation",
                                  cols[:, 3], cols[:, 4] if runtime else np.full(len(cols), -1, np.int64), False))
        starts = [s.start for s in sources if len(s.start)]
        zero = int(min(x.min() for x in starts)) if starts else 0
        gpu_index = next((a.logical_node_type_id for a in self.agents if a.id.handle == agent), -1)
        notes = [] if self.launches else [
            "rocprofv3 JSON without HIP/HSA API records: no kernel can be linked to its launch, so a RCCL kernel's "
            "collective is unknown (other communication) and kernels are attributed by name alone; record with "
            "--hip-trace (or --sys-trace) for launches"]
        if self.unknown:
            notes.append(f"rocprofv3 JSON: {self.unknown} ids in its records are not in the file (kernel_symbols, "
                         f"strings); those records are named by their id")
        extra = {"format": "rocprofv3 json", "process": self.pid, "agent": agent, "gpu": gpu_index,
                 "launches_recorded": self.launches, "unresolved_ids": self.unknown, "notes": notes}
        # rocprofiler's clock (host monotonic ns, shared by a host's processes) is the origin too
        return assemble(label, rank, sources, zero, zero, nbytes if first_of_process else 0, extra)


_OPS = 1 << 16  # kind * _OPS + operation: one integer per (kind, operation) name


def _array(rows: list[tuple], ncols: int) -> np.ndarray:
    """Records as int64 columns; a record with a value beyond int64 (msgspec's int admits uint64) is
    left out: the checked boundary's last word on numbers."""
    try:
        return np.array(rows, np.int64).reshape(len(rows), ncols)
    except OverflowError:
        good = [r for r in rows if int64_row(r)]
        return np.array(good, np.int64).reshape(len(good), ncols)
