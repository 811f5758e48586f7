"""Classify every event: compute, TP allreduce, CP ring, EP all-to-all, other communication,
memcpy, or other; and for communication, its op, axis and message size.

Names are classified once per unique name (a trace has hundreds of names and millions of
events), then mapped onto the event arrays. Sources, in order: a user rules file; our own
spans (`commprobe/comm/{axis}/{op}/bytes=…`); the communication kernels of comm_kernels.toml
(NCCL and RCCL old and new names, vLLM's custom allreduce, torch symmetric memory,
TensorRT-LLM, DeepEP and its forks, MSCCL++, NVSHMEM, our DDA); the c10d / record_param_comms
/ nccl: / gloo: CPU ops. Then every communication kernel is linked to the host op that
launched it (links.py) and takes that op's collective, group, size and Seq.

Each collective's axis carries how it was decided (`axis_source`): `declared` (our spans; a
process group whose name or description says tp/tensor, cp/context, ep/expert/moe, dp/data),
`inferred` (allreduce -> TP, all-to-all -> EP; in a training step with no tensor parallelism in
sight, allreduce / reduce-scatter / all-gather -> DP, context.py),
or `unknown` (a bare send/recv could be pipeline, context-parallel or part of an all-to-all:
it is p2p of unknown axis, never CP ring).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import numpy.ma  # noqa: F401  (np.unique/np.isin import it lazily: 50 ms inside the first analysis otherwise)

from commprobe.common.vocab import (
    AXIS_SOURCES,
    CATEGORIES,
    COMM_CODES,
    KERNEL_HINTS,
    OP_ALIASES,
    WORK_CATEGORIES,
    AxisSource,
    Category,
    category_for,
)

from ..readers.model import DEVICE_CATS, Trace, TraceError, codes
from .blocking import count_once
from .context import data_parallel, inherit_c10d, inherit_outer, sequence_parallel
from .coordinates import declare

_KERNELS_TOML = Path(__file__).parent.parent / "comm_kernels.toml"

# Category and axis-source codes as plain ints (numpy arrays hold them; the enums name them).
COMPUTE, TP_ALLREDUCE, CP_RING, EP_ALL_TO_ALL, OTHER_COMM, MEMCPY, OTHER, MARKER = map(int, Category)
DECLARED, INFERRED, UNKNOWN = int(AxisSource.DECLARED), int(AxisSource.INFERRED), int(AxisSource.UNKNOWN)
_IS_COMM = np.isin(np.arange(len(CATEGORIES)), COMM_CODES)
__all__ = ["AXIS_SOURCES", "CATEGORIES", "Classified", "classify", "classify_name", "comm_mask", "load_rules"]


def comm_mask(category: np.ndarray) -> np.ndarray:
    """Which events' category codes are communication (a table lookup per event)."""
    return _IS_COMM[category]


DTYPE_BYTES = {"float": 4, "float32": 4, "float16": 2, "half": 2, "bfloat16": 2, "bf16": 2, "double": 8,
                "float64": 8, "int": 4, "int32": 4, "long": 8, "int64": 8, "int8": 1, "uint8": 1, "byte": 1,
                "char": 1, "bool": 1, "short": 2, "int16": 2, "fp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


@lru_cache(maxsize=4096)
def normalize_op(text: str) -> str | None:
    t = text.strip().lower().rstrip("_")
    return OP_ALIASES.get(t) or OP_ALIASES.get(t + "_")


@dataclass
class NameClass:
    category: int
    op: str | None = None
    axis: str | None = None
    bytes: float = float("nan")
    needs_args: bool = False  # op/size/axis come from the event's args (record_param_comms, NCCL kernels)
    axis_source: int = 0


def _kernel_table() -> list[tuple[re.Pattern, str | None]]:
    """comm_kernels.toml as (pattern, op) pairs (op None: the name's first group says; "args":
    only the launching host op can say)."""
    import tomllib

    doc = tomllib.loads(_KERNELS_TOML.read_text())
    rules = []
    for k in doc["kernel"]:
        op = {"name": None, "host": "args"}.get(k["op"], k["op"])
        rules.append((re.compile(k["pattern"], re.IGNORECASE if "i" in k.get("flags", "") else 0), op))
    return rules


_KERNEL_RULES = _kernel_table()
# Host collective ops: torch's (c10d::*, nccl:*, ...), NCCL's own NVTX API ranges (named after the API
# function by NVTX3_FUNC_WITH_PARAMS: NVIDIA/nccl src/collectives.cc; RCCL adds "_impl"), and the
# MPI API ranges Nsight Systems records (`nsys profile --trace=mpi`, NVTX domain "MPI").
_CPU_OP = re.compile(r"^(?:c10d|c10d_functional|_c10d_functional)::(\w+)|^(?:nccl|gloo|mpi|ucc|dda):(\w+)"
                     r"|^nccl(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|Send|Recv|AllToAll|Gather|Scatter)"
                     r"(?:_impl)?$|^MPI_(Allreduce|Allgather|Alltoallv?|Reduce_scatter|Bcast|Send|Recv|Isend|Irecv"
                     r"|Sendrecv|Barrier|Reduce|Gather|Scatter)$")
_OWN_SPAN = re.compile(r"^commprobe/comm/(\w+)/(\w+)/bytes=(\d+)(?:/dtype=(\w+))?(?:/group=(\d+))?(?:/backend=(\w+))?")
# Window annotations (phases.py): markers, not work.
_PHASE = re.compile(r"^commprobe/(prefill|decode)\b|^ProfilerStep#\d+|^execute_context_\d|^execute_new_\d|^step\[|^(?:\[Executor\] )?_forward_step")
_KERNEL_OP_NAMES = {"allreduce": "allreduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
                    "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "send_recv", "send": "send_recv",
                    "recv": "send_recv", "alltoall": "all_to_all"}


_GROUP_AXES = [(axis, re.compile(pat)) for axis, pat in (
    ("tp", r"(?<![a-z])tp(?![a-z])|tensor"), ("cp", r"(?<![a-z])cp(?![a-z])|context|ring"),
    ("ep", r"(?<![a-z])ep(?![a-z])|expert|moe"), ("dp", r"(?<![a-z])dp(?![a-z])|data"))]  # tp, tp_group, mesh:tp


_OP_AXES = {"allreduce": "tp", "all_to_all": "ep"}  # what an undeclared collective implies in inference


@lru_cache(maxsize=4096)
def axis_for(op: str | None, group_text: str = "") -> tuple[str, int]:
    """(axis, how it was decided): declared by the process group's name or description, else
    inferred from the op (allreduce -> TP, all-to-all -> EP), else unknown ("other")."""
    g = group_text.lower()
    for axis, pat in _GROUP_AXES:
        if g and pat.search(g):
            return axis, DECLARED
    axis = _OP_AXES.get(op or "")
    return (axis, INFERRED) if axis else ("other", UNKNOWN)


@dataclass
class Rule:
    pattern: re.Pattern
    category: int
    axis: str | None
    op: str | None


def load_rules(path: str | Path) -> list[Rule]:
    """User rules: JSON list or TOML `[[rule]]` tables of {pattern, category, axis?, op?}."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise TraceError(f"{p}: cannot read rules file ({e.strerror})") from None
    try:
        if p.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text).get("rule", [])
        else:
            data = json.loads(text)
            data = data.get("rules", data) if isinstance(data, dict) else data
    except Exception as e:  # json.JSONDecodeError, tomllib.TOMLDecodeError
        raise TraceError(f"{p}: unreadable rules file ({e})") from None
    rules = []
    for i, r in enumerate(data if isinstance(data, list) else []):
        if not isinstance(r, dict) or "pattern" not in r or r.get("category") not in CATEGORIES:
            raise TraceError(f"{p}: rule {i} needs 'pattern' and a 'category' among {', '.join(WORK_CATEGORIES)}")
        try:
            pat = re.compile(r["pattern"])
        except re.error as e:
            raise TraceError(f"{p}: rule {i}: bad pattern ({e})") from None
        rules.append(Rule(pat, CATEGORIES.index(r["category"]), r.get("axis"), r.get("op")))
    return rules


def classify_name(name: str, cat: str, rules: list[Rule] = ()) -> NameClass:
    """The class of every event with this name and category. The ranks of a run share their names:
    without user rules, each distinct (name, category) is classified once per process."""
    for r in rules:
        if r.pattern.search(name):
            return NameClass(r.category, r.op, r.axis)
    return _builtin_class(name, cat)


@lru_cache(maxsize=1 << 16)
def _builtin_class(name: str, cat: str) -> NameClass:  # callers never mutate the result
    if _PHASE.match(name) or cat in ("python_function", "Trace", "gpu_user_annotation", "ac2g", "fwdbwd"):
        return NameClass(MARKER)
    m = _OWN_SPAN.match(name)
    if m:
        axis, op = m.group(1), normalize_op(m.group(2)) or m.group(2)
        c = category_for(op, axis)
        return NameClass(c, op, axis, float(m.group(3)), axis_source=DECLARED)
    if name.startswith("commprobe/"):  # our other spans (ring steps) hold compute and comm: markers
        return NameClass(MARKER)
    is_device = cat in DEVICE_CATS
    if cat in ("gpu_memcpy", "gpu_memset", "Memcpy", "Memset"):
        return NameClass(MEMCPY)
    low = name.lower()
    hinted = any(h in low for h in KERNEL_HINTS)  # C substring searches: faster than one regex alternation
    if is_device or cat in ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", ""):
        for pat, op in (_KERNEL_RULES if hinted else ()):
            m = pat.search(name)
            if not m:
                continue
            if op == "args":
                return NameClass(OTHER_COMM, None, None, needs_args=True, axis_source=UNKNOWN)
            if op == "compute":
                return NameClass(COMPUTE)
            if op is None:
                op = _KERNEL_OP_NAMES.get(m.group(1).lower())
            if op == "other":
                return NameClass(OTHER_COMM, None, "other", axis_source=UNKNOWN)
            # Prefer the process group named in the event's args when there is one.
            axis, src = axis_for(op)
            return NameClass(category_for(op, axis), op, axis, needs_args=is_device, axis_source=src)
        if name == "record_param_comms":
            return NameClass(OTHER_COMM, needs_args=True, axis_source=UNKNOWN)
        m = _CPU_OP.match(name)
        if m:
            op = normalize_op(next(g for g in m.groups() if g))
            if op:
                axis, src = axis_for(op)
                return NameClass(category_for(op, axis), op, axis, needs_args=True, axis_source=src)
        if is_device or cat in ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"):
            return NameClass(COMPUTE)
    return NameClass(OTHER)


@dataclass
class Classified:
    """Per-event classification of one trace, parallel to its arrays."""

    category: np.ndarray  # int8 codes
    comm_bytes: np.ndarray  # float64, NaN when unknown
    comm_op: np.ndarray  # object: op string for communication events, else None
    comm_axis: np.ndarray  # object
    comm_group: np.ndarray  # object: process group key (name or size) for cross-rank matching, None if unknown
    group_size: np.ndarray  # int, 0 unknown
    unknown_names: dict[str, int]  # names that fell into "other", with counts
    axis_source: np.ndarray  # int8 codes into AXIS_SOURCES (0: not a collective)
    seq: np.ndarray  # int64: the call's sequence number in its group (args Seq; a kernel's from its host op), -1
    links: dict = field(default_factory=dict)  # how communication kernels were linked to host ops (links.py)
    axis_notes: list[str] = field(default_factory=list)  # why an inferred axis is not the op's default
    call_end: np.ndarray | None = None  # float64: where a call ends past its own event (its wait, its work), NaN


# torch's names for the element types of "Input type" (record_function's recorded inputs)
INPUT_TYPE_BYTES = {"float": 4, "double": 8, "c10::half": 2, "c10::bfloat16": 2, "long int": 8, "int": 4,
                     "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::float8_e4m3fn": 1,
                     "c10::float8_e5m2": 1}


def _input_bytes(args: dict) -> float:
    """Bytes of the first recorded tensor input (Input Dims x Input type), for host ops that record
    no message size of their own (`nccl:all_to_all` in older PyTorch; vLLM's `_C::shm_allreduce`,
    whose first input is a scalar: its group); NaN when it cannot be told."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not (isinstance(dims, list) and isinstance(types, list)):
        return float("nan")
    for d, t in zip(dims, types):
        if isinstance(d, list) and d and isinstance(t, str):
            size = INPUT_TYPE_BYTES.get(t.lower())
            if size is None or not all(isinstance(x, int) and x >= 0 for x in d):
                return float("nan")
            return float(np.prod(d, dtype=np.float64)) * size
    return float("nan")


def _args_class(args: dict, fallback: NameClass) -> tuple[str | None, str | None, float, str | None, int, int]:
    op = normalize_op(str(args.get("Collective name", ""))) or fallback.op
    pg = f'{args.get("Process Group Description") or ""} {args.get("Process Group Name") or ""}'
    axis, src = axis_for(op, pg)
    nel = args.get("In msg nelems")
    if op in ("all_gather",) and args.get("Out msg nelems"):
        nel = args.get("Out msg nelems")
    dt = str(args.get("dtype", "")).lower()
    size = float(nel) * DTYPE_BYTES.get(dt, 0) if isinstance(nel, (int, float)) and dt in DTYPE_BYTES else float("nan")
    if nel is None and "dtype" not in args:
        size = _input_bytes(args)
    group = args.get("Process Group Name")
    gsize = args.get("Group size") or 0
    gsize = gsize if gsize.__class__ is int and 0 < gsize < 1 << 31 else 0  # a count of ranks, or unknown
    return op, axis, size, (str(group) if group is not None else None), gsize, src


def classify(trace: Trace, rules: list[Rule] = (), coords: dict[int, dict[str, int]] | None = None) -> Classified:
    """Classes by unique (name, cat); communication details by unique (name, cat, args subset).
    `coords`: every rank's coordinates from engines' file names (global rank -> {tp: .., dp: ..}),
    which declare the axis of the groups they identify (coordinates.py)."""
    n = len(trace.ts)
    ncat = max(1, len(trace.cats))
    uniq, inverse = codes(trace.name_id.astype(np.int64) * ncat + trace.cat_id, len(trace.names) * ncat)
    name_classes = [classify_name(trace.names[p // ncat], trace.cats[p % ncat] if trace.cats else "", rules)
                    for p in uniq.tolist()]
    class_category = np.array([c.category for c in name_classes], np.int8)
    category = class_category[inverse] if n else np.zeros(0, np.int8)
    comm_bytes = np.full(n, np.nan)
    group_size = np.zeros(n, np.int64)
    comm_op = np.full(n, None, object)
    comm_axis = np.full(n, None, object)
    comm_group = np.full(n, None, object)
    axis_source = np.zeros(n, np.int8)
    comm_idx = np.flatnonzero(comm_mask(category))
    if len(comm_idx):
        # One answer per distinct (name class, args subset): events that share both share it.
        # args for classes that need them, and for those whose name tells no size (the recorded input's)
        needs = np.array([c.needs_args or c.bytes != c.bytes for c in name_classes], bool)
        cls_of = inverse[comm_idx].astype(np.int64)
        rows = len(trace.arg_dicts) + 1  # arg_row + 1: 0 for "args not used"
        row = np.where(needs[cls_of], trace.arg_row[comm_idx], -1).astype(np.int64) + 1
        combos, combo_of = codes(cls_of * rows + row, len(uniq) * rows)
        out = [_comm_details(trace, name_classes[c // rows], uniq[c // rows] // ncat, c % rows - 1)
               for c in combos.tolist()]
        keep = np.array([o is not None for o in out], bool)[combo_of]
        idx, sel = comm_idx[keep], combo_of[keep]
        out = [o or (OTHER_COMM, None, None, np.nan, None, 0, UNKNOWN) for o in out]
        cat_c, op_c, axis_c, bytes_c, group_c, gsize_c, src_c = (np.array(col, dtype=object) for col in zip(*out))
        category[idx] = cat_c.astype(np.int8)[sel]
        comm_op[idx], comm_axis[idx], comm_group[idx] = op_c[sel], axis_c[sel], group_c[sel]
        comm_bytes[idx] = bytes_c.astype(np.float64)[sel]
        group_size[idx] = gsize_c.astype(np.int64)[sel]
        axis_source[idx] = src_c.astype(np.int8)[sel]
        axis_source[comm_idx[~keep]] = np.array([c.axis_source for c in name_classes], np.int8)[cls_of[~keep]]
    group_notes = declare(trace.distributed, coords or {}, comm_idx, category, comm_op, comm_axis, comm_group, axis_source)
    inherit_c10d(trace, category, comm_idx, comm_op, comm_axis, comm_bytes, axis_source)
    axis_notes = group_notes + sequence_parallel(trace, category, comm_idx, comm_op, comm_axis, axis_source)
    axis_notes += data_parallel(trace, category, comm_idx, comm_op, comm_axis, axis_source)
    inherit_outer(trace, category, comm_idx, comm_op, comm_axis, comm_bytes, axis_source, is_own_span,
                  lambda name: not is_own_span(name))
    call_end, once_notes = count_once(trace, category, comm_idx, comm_op, comm_axis, axis_source, comm_bytes,
                                      host_timeline=not trace.is_device().any())
    axis_notes += [n for n in once_notes if "call(s) are" in n]
    counts = np.bincount(inverse, minlength=len(uniq)) if n else np.zeros(len(uniq), np.int64)
    unknown: dict[str, int] = {}
    for k, c in enumerate(name_classes):
        if c.category == OTHER:
            name = trace.names[int(uniq[k]) // ncat]
            unknown[name] = unknown.get(name, 0) + int(counts[k])
    cls = Classified(category, comm_bytes, comm_op, comm_axis, comm_group, group_size, unknown, axis_source,
                     trace.arg_seq.copy(), axis_notes=axis_notes, call_end=call_end)
    return cls


def is_own_span(name: str) -> bool:
    """Our own communication spans (`commprobe/comm/{axis}/{op}/…`)."""
    return name.startswith("commprobe/comm/")


def _comm_details(trace: Trace, nc: NameClass, name_id: int, arg_row: int):
    """(category, op, axis, bytes, group, group size) of a communication event, or None to keep
    it as the name classified it (record_param_comms without a collective name)."""
    if nc.needs_args:
        args = trace.arg_dicts[arg_row] if arg_row >= 0 else {}
        op, axis, size, group, gsize, src = _args_class(args, nc)
        if op is None:
            return None
        return category_for(op, axis), op, axis, size, group, gsize, src
    m = _OWN_SPAN.match(trace.names[name_id])
    if m and m.group(5):
        return nc.category, nc.op, nc.axis, nc.bytes, m.group(1), int(m.group(5)), DECLARED
    size = nc.bytes
    if size != size and arg_row >= 0:  # no size in the name: the recorded input's, where shapes were recorded
        size = _input_bytes(trace.arg_dicts[arg_row])
    return nc.category, nc.op, nc.axis, size, None, 0, nc.axis_source
