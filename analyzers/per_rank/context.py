"""Second passes over a classified trace: what a collective is, told from its context rather than
its own name. A backend's op is the c10d op the program called (gloo's reduce_scatter runs as its
allreduce); a library op inside our own span takes the span's axis; all-to-alls around attention,
with no experts in sight, are sequence-parallel CP, not EP. Each pass writes the classification
arrays in place (classify.py calls them) and imports only the vocabulary."""

from __future__ import annotations

import re

import numpy as np

from commprobe.common.vocab import AxisSource, Category, category_for

from ..readers.model import Trace

COMPUTE = int(Category.COMPUTE)
DECLARED, INFERRED, UNKNOWN = int(AxisSource.DECLARED), int(AxisSource.INFERRED), int(AxisSource.UNKNOWN)


_ATTENTION = re.compile(r"attention|attn|fmha|sdpa|scaled_dot_product", re.I)
_EXPERTS = re.compile(r"moe|expert|topk|top_k|router|routing|grouped_gemm|gating|dispatch|combine", re.I)


def sequence_parallel(trace: Trace, category: np.ndarray, comm_idx: np.ndarray, comm_op: list, comm_axis: list,
                       axis_source: np.ndarray) -> list[str]:
    """An all-to-all is not always EP: sequence-parallel attention (DeepSpeed-Ulysses, xDiT,
    FastVideo) exchanges heads and sequence with all-to-alls around attention. Where attention
    runs between two all-to-alls whose axis was only inferred, and nothing of experts or routing is
    in the trace, those all-to-alls are CP, inferred, with the reason returned (it reaches the
    result's `axis_reasons`). A declared axis is never changed."""
    if not comm_idx.size:
        return []
    a2a = np.array([i for i in comm_idx.tolist() if comm_op[i] == "all_to_all" and comm_axis[i] == "ep"
                    and axis_source[i] == INFERRED], np.int64)
    if len(a2a) < 2 or _found("\n".join(trace.names).lower(), _EXPERT_WORDS, _EXPERTS):  # every name at once
        return []
    attn_names = np.array([bool(_ATTENTION.search(n)) for n in trace.names], bool)
    attn = np.flatnonzero(attn_names[trace.name_id] & (category == COMPUTE))
    if not len(attn):
        return []
    a2a = a2a[np.argsort(trace.ts[a2a], kind="stable")]
    ends, starts = trace.ts[a2a] + trace.dur[a2a], trace.ts[a2a]
    at = np.sort(trace.ts[attn])
    # attention that starts after one all-to-all ends and before the next starts
    k = np.searchsorted(at, ends[:-1], side="left")
    between = (k < len(at)) & (at[np.minimum(k, len(at) - 1)] < starts[1:])
    if not between.any():
        return []
    for i in a2a.tolist():
        comm_axis[i], category[i] = "cp", category_for("all_to_all", "cp")
    dev = int(trace.is_device()[a2a].sum())  # events, not calls: a call is a kernel and the host ops around it
    what = ("host op(s)" if not dev else "kernel(s)" if dev == len(a2a) else
            f"event(s) ({dev} kernel(s), {len(a2a) - dev} host op(s))")
    return [f"{len(a2a)} all-to-all {what} are CP (sequence-parallel attention, Ulysses-style): attention runs between "
            f"them ({int(between.sum())} time(s)) and nothing of experts or routing is in the trace"]


# Evidence a training job leaves: backward (the autograd engine), an optimizer step, DDP's
# forward/reducer, FSDP's hooks (FSDP1 and FSDP2 name their record_functions "FSDP::...").
_TRAINING = re.compile(r"^autograd::engine::evaluate_function|^Optimizer\.(step|zero_grad)|DistributedDataParallel|"
                       r"Reducer|^FSDP::|FullyShardedDataParallel|fully_shard", re.M)
_FSDP = re.compile(r"^FSDP::|FullyShardedDataParallel|fully_shard", re.M)
# Evidence of tensor parallelism: DTensor's functional collectives and parallel styles, Megatron's
# and vLLM's parallel layers and their collectives.
_TP = re.compile(r"^_c10d_functional::|ColwiseParallel|RowwiseParallel|parallelize_module|tensor_model_parallel|"
                 r"RowParallelLinear|ColumnParallelLinear|VocabParallelEmbedding", re.M)
_DP_OPS = ("allreduce", "reduce_scatter", "all_gather")
# The literal words each pattern needs: `in` finds them at C speed, the pattern confirms (a regex
# alternation scanned over every name cost ~2 ms per rank of a small trace).
_TRAINING_WORDS = ("autograd::engine::evaluate_function", "Optimizer.", "DistributedDataParallel", "Reducer", "FSDP::",
                   "FullyShardedDataParallel", "fully_shard")
_FSDP_WORDS = ("FSDP::", "FullyShardedDataParallel", "fully_shard")
_TP_WORDS = ("_c10d_functional::", "ColwiseParallel", "RowwiseParallel", "parallelize_module", "tensor_model_parallel",
             "RowParallelLinear", "ColumnParallelLinear", "VocabParallelEmbedding")
_EXPERT_WORDS = ("moe", "expert", "topk", "top_k", "router", "routing", "grouped_gemm", "gating", "dispatch", "combine")


def _found(text: str, words: tuple[str, ...], pattern: re.Pattern) -> bool:
    return any(w in text for w in words) and bool(pattern.search(text))


def data_parallel(trace: Trace, category: np.ndarray, comm_idx: np.ndarray, comm_op: list, comm_axis: list,
                  axis_source: np.ndarray) -> list[str]:
    """An allreduce is not always TP: a training step (backward and optimizer work, DDP's reducer,
    FSDP's hooks) with nothing of tensor parallelism in the trace reduces gradients over data
    parallelism: its allreduces, reduce-scatters and all-gathers whose axis was only inferred or
    is unknown are DP, inferred (FSDP: its all-gathers of parameters and reduce-scatters of
    gradients). Where the trace also shows tensor parallelism, an op-inferred allreduce could be
    either: its axis is unknown, never TP by default; DTensor's functional collectives stay TP.
    The reason is returned (the result's `axis_reasons`); a declared axis is never changed."""
    cands = [i for i in comm_idx.tolist()
             if comm_op[i] in _DP_OPS and axis_source[i] != DECLARED and comm_axis[i] in ("tp", "other")]
    if not cands:
        return []
    names = "\n".join(trace.names)  # every name at once (re.M: ^ starts each name)
    if not _found(names, _TRAINING_WORDS, _TRAINING):
        return []
    fsdp = _found(names, _FSDP_WORDS, _FSDP)
    tp_seen = _found(names, _TP_WORDS, _TP) or any(comm_axis[i] == "tp" and axis_source[i] == DECLARED
                                                   for i in comm_idx.tolist())
    moved = []
    for i in cands:
        if tp_seen:
            if comm_axis[i] == "tp" and not _TP.search(trace.names[trace.name_id[i]]):
                comm_axis[i], category[i], axis_source[i] = "other", category_for(comm_op[i], "other"), UNKNOWN
                moved.append(i)
            continue
        comm_axis[i], category[i], axis_source[i] = "dp", category_for(comm_op[i], "dp"), INFERRED
        moved.append(i)
    if not moved:
        return []
    if tp_seen:
        return [f"{len(moved)} allreduce event(s) of unknown axis: a training step (backward, optimizer) that also shows "
                f"tensor parallelism, so a gradient allreduce (DP) and a TP allreduce cannot be told apart"]
    what = "FSDP's all-gathers and reduce-scatters" if fsdp else "gradient reductions"
    return [f"{len(moved)} collective event(s) are DP ({what}): the trace holds a training step (backward, optimizer"
            f"{', FSDP hooks' if fsdp else ''}) and nothing of tensor parallelism"]


def is_c10d(name: str) -> bool:
    return name.startswith("c10d::")


_BACKENDS = ("gloo:", "nccl:", "mpi:", "ucc:", "xccl:", "ncclx:")


def _is_backend_op(name: str) -> bool:
    return name.startswith(_BACKENDS)


# A backend's op that implements a different c10d op: (what the backend records, what was called).
# gloo runs reduce_scatter (list and tensor forms) as its allreduce (torch 2.13, ProcessGroupGloo).
IMPLEMENTED_AS = {("allreduce", "reduce_scatter")}


def pair_backend_work(trace: Trace, comm_idx: np.ndarray) -> tuple[list[int], list[int]]:
    """(backend ops, the c10d op each runs): gloo runs a collective's work on its worker threads
    after the c10d op returns, with nothing in the trace tying the two, so each backend op is paired
    with the c10d op that started last before it (a blocking call waits for its work before the
    next is issued). Used to relabel the work (inherit_c10d) and to count it once (blocking.py)."""
    if not comm_idx.size:
        return [], []
    c10d = comm_idx[trace.events_named(comm_idx, is_c10d)]
    work = comm_idx[trace.events_named(comm_idx, _is_backend_op)]
    if not c10d.size or not work.size:
        return [], []
    c10d = c10d[np.argsort(trace.ts[c10d], kind="stable")]
    j = np.searchsorted(trace.ts[c10d], trace.ts[work], side="right") - 1
    return work[j >= 0].tolist(), c10d[j[j >= 0]].tolist()


def inherit_c10d(trace: Trace, category: np.ndarray, comm_idx: np.ndarray, comm_op: list, comm_axis: list,
                  comm_bytes: np.ndarray, axis_source: np.ndarray) -> None:
    """A backend's op (`gloo:all_reduce`) is the work of the c10d op the program called
    (`c10d::reduce_scatter_`): gloo implements reduce_scatter with its allreduce, which alone would
    read as a TP allreduce (tests/test_c10d_names.py). gloo runs a collective's work on its worker
    threads after the c10d op returns, with nothing in the trace tying the two, so the work is
    paired with the c10d op that started last before it (a blocking call waits for its work before
    the next is issued); and only the known implementations (`IMPLEMENTED_AS`) change the op, so a
    pairing that is off among overlapping async calls cannot relabel anything else."""
    for i, k in zip(*pair_backend_work(trace, comm_idx)):
        if (comm_op[i], comm_op[k]) not in IMPLEMENTED_AS:
            continue
        category[i] = category[k]
        comm_op[i], comm_axis[i] = comm_op[k], comm_axis[k]
        axis_source[i] = axis_source[k]
        if np.isnan(comm_bytes[i]):
            comm_bytes[i] = comm_bytes[k]


def inherit_outer(trace: Trace, category: np.ndarray, comm_idx: np.ndarray, comm_op: list, comm_axis: list,
                   comm_bytes: np.ndarray, axis_source: np.ndarray, is_outer, is_inner) -> None:
    """A communication event that starts inside an outer one (by time: gloo runs its work on a worker
    thread) is the outer one's work and takes its category, axis and op:
    - a backend's op inside the c10d op the program called: gloo implements `reduce_scatter` with its
      allreduce (`c10d::reduce_scatter_` holds `gloo:all_reduce`, torch 2.13; tests/test_c10d_names.py),
      which alone would read as a TP allreduce;
    - a library's op inside one of our own spans (`commprobe/comm/...`), whose axis the library's
      event cannot tell (a CP all-gather would otherwise be `other_comm`)."""
    if not comm_idx.size:
        return
    outer_mask = trace.events_named(comm_idx, is_outer)
    inner_mask = trace.events_named(comm_idx, is_inner) & ~outer_mask
    own, lib = comm_idx[outer_mask], comm_idx[inner_mask]
    if not own.size or not lib.size:
        return
    order = np.argsort(trace.ts[own], kind="stable")
    own = own[order]
    starts, ends = trace.ts[own], trace.ts[own] + trace.dur[own]
    j = np.searchsorted(starts, trace.ts[lib], side="right") - 1
    inside = (j >= 0) & (trace.ts[lib] <= ends[np.maximum(j, 0)])
    for i, k in zip(lib[inside], own[j[inside]]):
        if comm_op[k] is None:
            continue
        category[i] = category[k]
        comm_op[i], comm_axis[i] = comm_op[k], comm_axis[k]
        axis_source[i] = DECLARED
        if np.isnan(comm_bytes[i]):
            comm_bytes[i] = comm_bytes[k]
