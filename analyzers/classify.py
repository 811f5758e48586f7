"""Classify every event: compute, TP allreduce, CP ring, EP all-to-all, other communication,
memcpy, or other; and for communication, its op, axis and message size.

Names are classified once per unique name (a trace has hundreds of names and millions of
events), then mapped onto the event arrays. Sources, in order: a user rules file; our own
spans (`commprobe/comm/{axis}/{op}/bytes=…`); communication kernels users really run (NCCL
and RCCL old and new names, vLLM's custom allreduce, torch symmetric memory, TensorRT-LLM,
DeepEP, MSCCL++, our DDA); the c10d / record_param_comms / nccl: / gloo: CPU ops. The axis of
a foreign collective comes from its process group's name or description when that says
(tp/tensor, cp/context, ep/expert/moe, dp/data), else from the op (allreduce -> TP,
all-to-all -> EP, send/recv -> CP ring).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import numpy.ma  # noqa: F401  (np.unique/np.isin import it lazily: 50 ms inside the first analysis otherwise)

from .trace import DEVICE_CATS, Trace, TraceError

# Category codes (indexes into CATEGORIES).
COMPUTE, TP_ALLREDUCE, CP_RING, EP_ALL_TO_ALL, OTHER_COMM, MEMCPY, OTHER, MARKER = range(8)
CATEGORIES = ["compute", "tp_allreduce", "cp_ring", "ep_all_to_all", "other_comm", "memcpy", "other", "marker"]
COMM_CODES = (TP_ALLREDUCE, CP_RING, EP_ALL_TO_ALL, OTHER_COMM)
_IS_COMM = np.isin(np.arange(len(CATEGORIES)), COMM_CODES)


def comm_mask(category: np.ndarray) -> np.ndarray:
    """Which events' category codes are communication (a table lookup per event)."""
    return _IS_COMM[category]
AXES = ["tp", "cp", "ep", "dp", "other"]

_OP_ALIASES = {
    "allreduce": "allreduce", "all_reduce": "allreduce", "allreduce_coalesced": "allreduce",
    "allgather": "all_gather", "all_gather": "all_gather", "_allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "all_gather_into_tensor": "all_gather",
    "allgather_coalesced": "all_gather", "reducescatter": "reduce_scatter", "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "alltoall": "all_to_all", "all_to_all": "all_to_all", "alltoall_base": "all_to_all", "all_to_all_single": "all_to_all",
    "alltoallv": "all_to_all", "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "send": "send_recv", "recv": "send_recv", "recv_": "send_recv", "sendrecv": "send_recv", "send_recv": "send_recv",
    "recv_any_source": "send_recv", "batch_isend_irecv": "send_recv", "barrier": "barrier", "monitored_barrier": "barrier",
}
_BUS_FACTORS = {"allreduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n}
_DTYPE_BYTES = {"float": 4, "float32": 4, "float16": 2, "half": 2, "bfloat16": 2, "bf16": 2, "double": 8,
                "float64": 8, "int": 4, "int32": 4, "long": 8, "int64": 8, "int8": 1, "uint8": 1, "byte": 1,
                "char": 1, "bool": 1, "short": 2, "int16": 2, "fp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


def bus_factor(op: str, n: int) -> float:
    f = _BUS_FACTORS.get(op)
    return f(n) if f and n > 1 else 1.0


@lru_cache(maxsize=4096)
def normalize_op(text: str) -> str | None:
    t = text.strip().lower().rstrip("_")
    return _OP_ALIASES.get(t) or _OP_ALIASES.get(t + "_")


@dataclass
class NameClass:
    category: int
    op: str | None = None
    axis: str | None = None
    bytes: float = float("nan")
    needs_args: bool = False  # op/size/axis come from the event's args (record_param_comms, NCCL kernels)


# Kernels and ops that move data between ranks. (pattern, op or None when the name says it)
_KERNEL_RULES: list[tuple[re.Pattern, str | None]] = [
    (re.compile(r"nccl(?:Dev)?Kernel_(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|Send|Recv|AllToAll)",
                re.IGNORECASE), None),
    (re.compile(r"rccl|nccl(?:Dev)?Kernel_Generic|ncclDevKernel|ncclKernel", re.IGNORECASE), "args"),
    (re.compile(r"cross_device_reduce_(?:1|2)stage"), "allreduce"),  # vLLM custom allreduce
    (re.compile(r"(?:one|two)_shot_all_reduce|multimem_(?:one_shot_)?all_reduce|symm_mem.*all_reduce"), "allreduce"),
    (re.compile(r"multimem_all_gather|symm_mem.*all_gather"), "all_gather"),
    (re.compile(r"(?:one|two)ShotAllReduce|allReduce(?:One|Two)Shot|customAllReduce|allreduce_fusion_kernel|"
                r"lamport.*all_?reduce", re.IGNORECASE), "allreduce"),  # TensorRT-LLM
    (re.compile(r"deep_ep::.*(?:dispatch|combine)|deep_ep.*(?:dispatch|combine)"), "all_to_all"),  # DeepEP
    (re.compile(r"mscclpp.*all_?reduce|allreduce.*mscclpp", re.IGNORECASE), "allreduce"),
    (re.compile(r"mscclpp.*all_?gather", re.IGNORECASE), "all_gather"),
    (re.compile(r"mscclpp", re.IGNORECASE), "other"),
    (re.compile(r"dda_(?:one|two)shot|commprobe_dda", re.IGNORECASE), "allreduce"),  # our GPU DDA kernels
]
# Every kernel rule above needs one of these substrings (lowercased): a C-speed prefilter that spares
# the regexes the long C++ template names of ordinary compute kernels.
_COMM_HINTS = ("nccl", "rccl", "all_reduce", "allreduce", "all_gather", "allgather", "deep_ep", "mscclpp",
               "dda_", "commprobe", "cross_device_reduce", "lamport")
_CPU_OP = re.compile(r"^(?:c10d|c10d_functional|_c10d_functional)::(\w+)|^(?:nccl|gloo|mpi|ucc|dda):(\w+)")
_OWN_SPAN = re.compile(r"^commprobe/comm/(\w+)/(\w+)/bytes=(\d+)(?:/dtype=(\w+))?(?:/group=(\d+))?(?:/backend=(\w+))?")
_PHASE = re.compile(r"^commprobe/(prefill|decode)\b|^ProfilerStep#\d+")
_KERNEL_OP_NAMES = {"allreduce": "allreduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
                    "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "send_recv", "send": "send_recv",
                    "recv": "send_recv", "alltoall": "all_to_all"}


_GROUP_AXES = [(axis, re.compile(pat)) for axis, pat in (
    ("tp", r"\btp\b|tensor"), ("cp", r"\bcp\b|context|ring"), ("ep", r"\bep\b|expert|moe"), ("dp", r"\bdp\b|data"))]


@lru_cache(maxsize=4096)
def axis_for(op: str | None, group_text: str = "") -> str:
    g = group_text.lower()
    for axis, pat in _GROUP_AXES:
        if g and pat.search(g):
            return axis
    return {"allreduce": "tp", "all_to_all": "ep", "send_recv": "cp"}.get(op or "", "other")


def category_for(op: str | None, axis: str | None) -> int:
    """TP allreduces; everything on the CP axis is ring attention (ring send/recv, pass-Q's
    all-to-all return, CP decode's all-gather of partials); EP dispatch/combine all-to-alls
    and the MoE's all-gather that re-replicates tokens are EP traffic."""
    if op == "allreduce" and axis == "tp":
        return TP_ALLREDUCE
    if axis == "cp" and op in ("send_recv", "all_gather", "all_to_all"):
        return CP_RING
    if axis == "ep" and op in ("all_to_all", "all_gather"):
        return EP_ALL_TO_ALL
    return OTHER_COMM


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
            raise TraceError(f"{p}: rule {i} needs 'pattern' and a 'category' among {', '.join(CATEGORIES[:7])}")
        try:
            pat = re.compile(r["pattern"])
        except re.error as e:
            raise TraceError(f"{p}: rule {i}: bad pattern ({e})") from None
        rules.append(Rule(pat, CATEGORIES.index(r["category"]), r.get("axis"), r.get("op")))
    return rules


def classify_name(name: str, cat: str, rules: list[Rule] = ()) -> NameClass:
    for r in rules:
        if r.pattern.search(name):
            return NameClass(r.category, r.op, r.axis)
    if _PHASE.match(name) or cat in ("python_function", "Trace", "gpu_user_annotation", "ac2g", "fwdbwd"):
        return NameClass(MARKER)
    m = _OWN_SPAN.match(name)
    if m:
        axis, op = m.group(1), normalize_op(m.group(2)) or m.group(2)
        c = category_for(op, axis)
        return NameClass(c, op, axis, float(m.group(3)))
    if name.startswith("commprobe/"):  # our other spans (ring steps) hold compute and comm: markers
        return NameClass(MARKER)
    is_device = cat in DEVICE_CATS
    if cat in ("gpu_memcpy", "gpu_memset", "Memcpy", "Memset"):
        return NameClass(MEMCPY)
    low = name.lower()
    hinted = any(h in low for h in _COMM_HINTS)  # C substring searches: faster than one regex alternation
    if is_device or cat in ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", ""):
        for pat, op in (_KERNEL_RULES if hinted else ()):
            m = pat.search(name)
            if not m:
                continue
            if op == "args":
                return NameClass(OTHER_COMM, None, None, needs_args=True)
            if op is None:
                op = _KERNEL_OP_NAMES.get(m.group(1).lower())
            if op == "other":
                return NameClass(OTHER_COMM, None, "other")
            # Prefer the process group named in the event's args when there is one.
            return NameClass(category_for(op, axis_for(op)), op, axis_for(op), needs_args=is_device)
        if name == "record_param_comms":
            return NameClass(OTHER_COMM, needs_args=True)
        m = _CPU_OP.match(name)
        if m:
            op = normalize_op(m.group(1) or m.group(2))
            if op:
                return NameClass(category_for(op, axis_for(op)), op, axis_for(op), needs_args=True)
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


def _args_class(args: dict, fallback: NameClass) -> tuple[str | None, str | None, float, str | None, int]:
    op = normalize_op(str(args.get("Collective name", ""))) or fallback.op
    pg = f'{args.get("Process Group Description") or ""} {args.get("Process Group Name") or ""}'
    axis = axis_for(op, pg)
    nel = args.get("In msg nelems")
    if op in ("all_gather",) and args.get("Out msg nelems"):
        nel = args.get("Out msg nelems")
    dt = str(args.get("dtype", "")).lower()
    size = float(nel) * _DTYPE_BYTES.get(dt, 0) if isinstance(nel, (int, float)) and dt in _DTYPE_BYTES else float("nan")
    group = args.get("Process Group Name")
    gsize = args.get("Group size") or 0
    return op, axis, size, (str(group) if group is not None else None), int(gsize) if isinstance(gsize, int) else 0


def _codes(keys: np.ndarray, space: int) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(keys, return_inverse=True) for non-negative keys below `space`, in O(n) when the
    space is small enough for a lookup table (the usual case: names x cats)."""
    if space > 1 << 24 or not len(keys):
        uniq, inverse = np.unique(keys, return_inverse=True)
        return uniq, inverse.reshape(-1)
    present = np.zeros(space, bool)
    present[keys] = True
    uniq = np.flatnonzero(present)
    lut = np.zeros(space, np.int32)
    lut[uniq] = np.arange(len(uniq), dtype=np.int32)
    return uniq, lut[keys]


def classify(trace: Trace, rules: list[Rule] = ()) -> Classified:
    """Classes by unique (name, cat); communication details by unique (name, cat, args subset)."""
    n = len(trace.ts)
    ncat = max(1, len(trace.cats))
    uniq, inverse = _codes(trace.name_id.astype(np.int64) * ncat + trace.cat_id, len(trace.names) * ncat)
    name_classes = [classify_name(trace.names[p // ncat], trace.cats[p % ncat] if trace.cats else "", rules)
                    for p in uniq.tolist()]
    codes = np.array([c.category for c in name_classes], np.int8)
    category = codes[inverse] if n else np.zeros(0, np.int8)
    comm_bytes = np.full(n, np.nan)
    group_size = np.zeros(n, np.int64)
    comm_op = np.full(n, None, object)
    comm_axis = np.full(n, None, object)
    comm_group = np.full(n, None, object)
    comm_idx = np.flatnonzero(comm_mask(category))
    if len(comm_idx):
        # One answer per distinct (name class, args subset): events that share both share it.
        needs = np.array([c.needs_args for c in name_classes], bool)
        cls_of = inverse[comm_idx].astype(np.int64)
        rows = len(trace.arg_dicts) + 1  # arg_row + 1: 0 for "args not used"
        row = np.where(needs[cls_of], trace.arg_row[comm_idx], -1).astype(np.int64) + 1
        combos, combo_of = _codes(cls_of * rows + row, len(uniq) * rows)
        out = [_comm_details(trace, name_classes[c // rows], uniq[c // rows] // ncat, c % rows - 1)
               for c in combos.tolist()]
        keep = np.array([o is not None for o in out], bool)[combo_of]
        idx, sel = comm_idx[keep], combo_of[keep]
        out = [o or (OTHER_COMM, None, None, np.nan, None, 0) for o in out]
        cat_c, op_c, axis_c, bytes_c, group_c, gsize_c = (np.array(col, dtype=object) for col in zip(*out))
        category[idx] = cat_c.astype(np.int8)[sel]
        comm_op[idx], comm_axis[idx], comm_group[idx] = op_c[sel], axis_c[sel], group_c[sel]
        comm_bytes[idx] = bytes_c.astype(np.float64)[sel]
        group_size[idx] = gsize_c.astype(np.int64)[sel]
    _inherit_own_spans(trace, category, comm_idx, comm_op, comm_axis, comm_bytes)
    counts = np.bincount(inverse, minlength=len(uniq)) if n else np.zeros(len(uniq), np.int64)
    unknown: dict[str, int] = {}
    for k, c in enumerate(name_classes):
        if c.category == OTHER:
            name = trace.names[int(uniq[k]) // ncat]
            unknown[name] = unknown.get(name, 0) + int(counts[k])
    return Classified(category, comm_bytes, comm_op, comm_axis, comm_group, group_size, unknown)


def is_own_span(name: str) -> bool:
    """Our own communication spans (`commprobe/comm/{axis}/{op}/…`)."""
    return name.startswith("commprobe/comm/")


def _comm_details(trace: Trace, nc: NameClass, name_id: int, arg_row: int):
    """(category, op, axis, bytes, group, group size) of a communication event, or None to keep
    it as the name classified it (record_param_comms without a collective name)."""
    if nc.needs_args:
        args = trace.arg_dicts[arg_row] if arg_row >= 0 else {}
        op, axis, size, group, gsize = _args_class(args, nc)
        if op is None:
            return None
        return category_for(op, axis), op, axis, size, group, gsize
    m = _OWN_SPAN.match(trace.names[name_id])
    if m and m.group(5):
        return nc.category, nc.op, nc.axis, nc.bytes, m.group(1), int(m.group(5))
    return nc.category, nc.op, nc.axis, nc.bytes, None, 0


def _inherit_own_spans(trace: Trace, category: np.ndarray, comm_idx: np.ndarray, comm_op: list, comm_axis: list,
                       comm_bytes: np.ndarray) -> None:
    """A library's communication op that starts inside one of our own spans (`c10d::_allgather_base_`,
    `gloo:all_gather` on gloo's worker thread) is that span's work: it takes the span's category,
    axis and op, which the library's own event cannot tell (a CP all-gather would otherwise be
    `other_comm`)."""
    if not comm_idx.size:
        return
    is_own = trace.events_named(comm_idx, is_own_span)
    own, lib = comm_idx[is_own], comm_idx[~is_own]
    if not own.size or not lib.size:
        return
    order = np.argsort(trace.ts[own], kind="stable")
    own = own[order]
    starts, ends = trace.ts[own], trace.ts[own] + trace.dur[own]
    j = np.searchsorted(starts, trace.ts[lib], side="right") - 1
    inside = (j >= 0) & (trace.ts[lib] <= ends[np.maximum(j, 0)])
    for i, k in zip(lib[inside], own[j[inside]]):
        category[i] = category[k]
        comm_op[i], comm_axis[i] = comm_op[k], comm_axis[k]
        if np.isnan(comm_bytes[i]):
            comm_bytes[i] = comm_bytes[k]
