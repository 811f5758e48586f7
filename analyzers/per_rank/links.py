"""Cross-stack correlation: every communication kernel linked to the runtime call that launched
it, and that call to the host collective op around it on the same thread.

A kernel's name tells little: NCCL runs all-to-all, and depending on version, size and topology
reduce-scatter, all-gather and even allreduce, as `ncclKernel_SendRecv` / `ncclDevKernel_SendRecv`;
an EP library's kernels name no group. The host op that launched the kernel (`nccl:all_to_all`,
`c10d::allreduce_`, `record_param_comms`, `vllm::all_reduce`, our own spans...) knows the
collective, the process group, the message size and the sequence number, so the kernel takes
them from it. Links, all vectorised (sorted searches, no Python loop per event):

- kernel -> launch: Kineto gives the kernel and its runtime call (cudaLaunchKernel,
  hipLaunchKernel, ...; for a CUDA/HIP graph replay, cudaGraphLaunch/hipGraphLaunch) the same
  `correlation` id (the `ac2g` flow events carry the same id);
- launch -> host op: the innermost host collective op on the launch's thread whose interval
  holds the launch; where that op says no collective (a bare record_param_comms), the
  outermost one around it that does;
- a host collective inside a gradient-ready hook (`autograd::engine::evaluate_function:
  torch::autograd::AccumulateGrad`, where DDP and FSDP fire) is gradient synchronisation:
  data parallelism (inferred), not tensor parallelism.

What could not be linked is counted, never guessed: kernels whose correlation points at no
launch in the trace, and kernels launched outside every host collective op (they keep what
their own name says).
"""

from __future__ import annotations

import numpy as np

from ..readers.model import RUNTIME_CATS, Trace, factorize
from . import intervals as iv
from .classify import DECLARED, INFERRED, OTHER_COMM, Classified, category_for, comm_mask

# Where gradient-ready hooks run (DDP's Reducer and FSDP fire their gradient collectives there);
# a TP layer's backward allreduce or an embedding's backward all-to-all runs in its own node's
# evaluate_function instead, and keeps the axis of its op.
_GRAD_HOOK = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"


def link_kernels_to_host_ops(trace: Trace, cls: Classified) -> None:
    """Give each linked communication kernel its host op's category, op, axis (and its source),
    group, size and Seq, in place; record the counts in `cls.links`."""
    dev = trace.is_device()
    comm = comm_mask(cls.category)
    kernels = np.flatnonzero(dev & comm)
    links = {"comm_kernels": int(len(kernels)), "linked": 0, "no_launch": 0, "outside_host_op": 0,
             "no_correlation": 0, "graph_replays": 0}
    cls.links = links
    if not len(kernels):
        return
    corr = trace.arg_corr
    has_corr = corr[kernels] >= 0
    links["no_correlation"] = int((~has_corr).sum())
    launches = np.flatnonzero(~dev & (corr >= 0))
    lorder = launches[np.argsort(corr[launches], kind="stable")]
    lcorr = corr[lorder]
    k = kernels[has_corr]
    pos = np.minimum(np.searchsorted(lcorr, corr[k]), max(len(lcorr) - 1, 0))
    found = (lcorr[pos] == corr[k]) if len(lcorr) else np.zeros(len(k), bool)
    links["no_launch"] = int((~found).sum())
    k, launch = k[found], lorder[pos[found]]
    graph = trace.events_named(launch, lambda n: "graphlaunch" in n.lower())
    links["graph_replays"] = int(graph.sum())
    # Host collective ops: communication events off the device that are not runtime calls.
    host_cat = np.array([c not in RUNTIME_CATS for c in trace.cats], bool)[trace.cat_id] if trace.cats else ~dev
    host = np.flatnonzero(~dev & comm & host_cat)
    _backward_is_dp(trace, cls, host)
    if not len(k) or not len(host):
        links["outside_host_op"] = int(len(k))
        return
    _merge_host_stack(trace, cls, host)
    has_op = cls.comm_op[host].astype(bool)
    h = iv.enclosing(trace.tid_id[host].astype(np.float64), trace.ts[host], trace.ts[host] + trace.dur[host],
                   trace.tid_id[launch].astype(np.float64), trace.ts[launch], ok=has_op)
    inside = h >= 0
    links["outside_host_op"] = int((~inside).sum())
    links["linked"] = int(inside.sum())
    k, op_idx = k[inside], host[h[inside]]
    _take_host_fields(cls, k, op_idx)


def _parents(tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For nested intervals on threads: each one's enclosing interval (-1: none), the latest-starting
    one before it that holds its start, else the one reaching furthest (ties in start: longer first)."""
    n = len(start)
    out = np.full(n, -1, np.int64)
    if n < 2:
        return out
    ks, ke = iv.thread_keys((tid, start), (tid, end))
    order = np.lexsort((-(end - start), ks))
    ks, ke = ks[order], ke[order]
    prev = np.arange(n) - 1
    pj = np.maximum(prev, 0)
    inner = (prev >= 0) & (ke[pj] >= ks)
    run, at = iv.furthest_so_far(ke)
    outer = (prev >= 0) & ~inner & (run[pj] >= ks)
    parent = np.full(n, -1, np.int64)
    parent[inner] = pj[inner]
    parent[outer] = at[pj[outer]]
    out[order] = np.where(parent >= 0, order[np.maximum(parent, 0)], -1)
    return out


def _merge_host_stack(trace: Trace, cls: Classified, host: np.ndarray) -> None:
    """Host collective ops nest (c10d::allreduce_ > record_param_comms > nccl:all_reduce): what the
    inner one does not record (its op, group, size, Seq, a declared axis), its enclosing ones may."""
    par = _parents(trace.tid_id[host].astype(np.float64), trace.ts[host], trace.ts[host] + trace.dur[host])
    for _ in range(3):  # three levels of nesting cover torch's stacks
        has = par >= 0
        child, parent = host[has], host[par[has]]
        if not len(child):
            return
        no_op = ~cls.comm_op[child].astype(bool)
        cls.comm_op[child[no_op]] = cls.comm_op[parent[no_op]]
        for col, known in ((cls.comm_group, (cls.comm_group[child] == None) & (cls.comm_group[parent] != None)),  # noqa: E711
                           (cls.group_size, (cls.group_size[child] <= 0) & (cls.group_size[parent] > 0)),
                           (cls.seq, (cls.seq[child] < 0) & (cls.seq[parent] >= 0)),
                           (cls.comm_bytes, np.isnan(cls.comm_bytes[child]) & ~np.isnan(cls.comm_bytes[parent]))):
            col[child[known]] = col[parent[known]]
        declared = (cls.axis_source[child] != DECLARED) & (cls.axis_source[parent] == DECLARED)
        declared |= no_op & (cls.axis_source[parent] > 0)
        cls.comm_axis[child[declared]] = cls.comm_axis[parent[declared]]
        cls.axis_source[child[declared]] = cls.axis_source[parent[declared]]
    _recategorize(cls, host)


def _take_host_fields(cls: Classified, k: np.ndarray, op_idx: np.ndarray) -> None:
    """Kernel k takes what its host op knows: the op always; group, group size, size and Seq where
    the host op records them (else the kernel's own args stand); the axis unless the kernel's own
    args declare one and the host op's do not. The category follows from (op, axis)."""
    cls.comm_op[k] = cls.comm_op[op_idx]
    for col, known in ((cls.comm_group, cls.comm_group[op_idx] != None),  # noqa: E711 (object array)
                       (cls.group_size, cls.group_size[op_idx] > 0),
                       (cls.seq, cls.seq[op_idx] >= 0),
                       (cls.comm_bytes, ~np.isnan(cls.comm_bytes[op_idx]))):
        col[k[known]] = col[op_idx[known]]
    take = ~((cls.axis_source[k] == DECLARED) & (cls.axis_source[op_idx] != DECLARED))
    cls.comm_axis[k[take]] = cls.comm_axis[op_idx[take]]
    cls.axis_source[k[take]] = cls.axis_source[op_idx[take]]
    _recategorize(cls, k)


def _recategorize(cls: Classified, idx: np.ndarray) -> None:
    """Events whose (op, axis) changed take the category that pair means (one answer per pair)."""
    pair, pairs = factorize(list(zip(cls.comm_op[idx].tolist(), cls.comm_axis[idx].tolist())))
    cls.category[idx] = np.array([category_for(o, a) for o, a in pairs] or [OTHER_COMM], np.int8)[pair]


def _backward_is_dp(trace: Trace, cls: Classified, ops: np.ndarray) -> None:
    """Host collectives launched inside a gradient-ready hook synchronise gradients: axis dp,
    inferred, unless their process group declared an axis."""
    ops = np.unique(ops)
    ops = ops[cls.axis_source[ops] != DECLARED]
    bw_ids = [i for i, n in enumerate(trace.names) if n.startswith(_GRAD_HOOK)]
    if not len(ops) or not bw_ids:
        return
    bw = np.flatnonzero(np.isin(trace.name_id, bw_ids))
    inside = iv.enclosing(trace.tid_id[bw].astype(np.float64), trace.ts[bw], trace.ts[bw] + trace.dur[bw],
                        trace.tid_id[ops].astype(np.float64), trace.ts[ops]) >= 0
    sel = ops[inside]
    cls.comm_axis[sel] = "dp"
    cls.axis_source[sel] = INFERRED
    cls.category[sel] = OTHER_COMM  # category_for(op, "dp") for every op
