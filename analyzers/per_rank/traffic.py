"""Who sends how much to whom in a rank's all-to-all calls, summed per phase: the rank's row (bytes
sent to each peer of its group) and column (bytes received from each) of the traffic matrix that
cross_rank/traffic.py assembles.

Where the sizes come from, per call, the first that the trace records:
- our own span (`commprobe/comm/ep/all_to_all/…/grank=R/send=B0.B1…/recv=B0.B1…`, bytes);
- torch's `c10d::alltoall_base_` recorded with shapes (`record_shapes=True`): its "Concrete Inputs"
  hold the output and input split sizes in rows (arguments 3 and 4 of `alltoall_base_(output,
  input, pg, output_split_sizes, input_split_sizes, …)`) and "Input Dims"/"Input type" the row size;
- NCCL's all-to-all as torch records it (record_param_comms and the kernel's args): "In split size"
  and "Out split size" (rows, a JSON string), "In/Out msg nelems" and "dtype" (torch's
  ParamCommsUtils);
- NCCL's own NVTX payloads in an Nsight export (its ncclSend/ncclRecv ranges' bytes and peers,
  readers/nvtx_payloads.py), put on the call's kernel and torch's ranges around it by the reader.
An **even** call (the split lists recorded empty, "[]": `all_to_all_single` without split sizes,
the fixed-capacity dispatch of DeepSpeed-MoE and GShard-style gates) sends every group rank the same
share of its buffer: no matrix without the group's size, but every receiver gets the same bytes
whatever the routing. It is counted as such (`even`), not as unsized.
A call none of them describes counts as unsized: the phase then says how many calls the matrix
leaves out, and a phase with no sized call has no matrix (sizes not recorded), never a guess.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np

from ..readers.model import Trace
from .calls import Calls
from .classify import DTYPE_BYTES, INPUT_TYPE_BYTES  # the one table of each: classify sizes messages by them

_SPLITS = re.compile(r"/grank=(\d+)/send=([\d.]*)/recv=([\d.]*)")
MAX_GROUP = 4096  # a split list longer than this is not a group we believe


def _ints(text: str) -> list[int] | None:
    try:
        out = [int(x) for x in text.split(".")] if text else []
    except ValueError:
        return None
    return out if len(out) <= MAX_GROUP and all(x >= 0 for x in out) else None


def own_span_splits(name: str) -> tuple[int, list[int], list[int]] | None:
    """(group rank, bytes sent to each group rank, bytes received from each) from our span's name."""
    m = _SPLITS.search(name)
    if not m:
        return None
    send, recv = _ints(m.group(2)), _ints(m.group(3))
    if send is None or recv is None or len(send) != len(recv) or not send or int(m.group(1)) >= len(send):
        return None
    return int(m.group(1)), send, recv


def c10d_splits(args: dict) -> tuple[list[int], list[int]] | None:
    """(bytes sent to each group rank, bytes received from each) from a `c10d::alltoall_base_`'s
    recorded shapes, or None where they are not recorded (no record_shapes, equal splits: [])."""
    concrete, dims, types = args.get("Concrete Inputs"), args.get("Input Dims"), args.get("Input type")
    if not (isinstance(concrete, list) and len(concrete) >= 5 and isinstance(dims, list) and len(dims) >= 2):
        return None
    try:
        out_rows, in_rows = json.loads(concrete[3]), json.loads(concrete[4])
    except (TypeError, ValueError):
        return None
    if not (isinstance(out_rows, list) and isinstance(in_rows, list) and out_rows and len(out_rows) == len(in_rows)
            and len(in_rows) <= MAX_GROUP and all(isinstance(x, int) and x >= 0 for x in out_rows + in_rows)):
        return None
    shape = dims[1] if isinstance(dims[1], list) else None
    elem = INPUT_TYPE_BYTES.get(types[1].lower()) if isinstance(types, list) and len(types) > 1 \
        and isinstance(types[1], str) else None
    if not shape or elem is None or not all(isinstance(d, int) and d >= 0 for d in shape):
        return None
    row = math.prod(shape[1:]) * elem
    return [x * row for x in in_rows], [x * row for x in out_rows]


def even_split(args: dict) -> bool:
    """Whether an all-to-all's recorded args say it splits evenly: torch's c10d op with both split
    lists recorded empty and its tensors' shapes recorded, NCCL's "In/Out split size" "[]", or NCCL's
    one-call ncclAlltoAll in an Nsight export (its bytes per peer, the communicator's size unknown)."""
    concrete, dims = args.get("Concrete Inputs"), args.get("Input Dims")
    if isinstance(concrete, list) and len(concrete) >= 5 and isinstance(dims, list) and len(dims) >= 2:
        return concrete[3] == concrete[4] == "[]" and all(isinstance(d, list) and d for d in dims[:2])
    if isinstance(args.get("nccl_uniform_bytes"), int):  # NCCL's ncclAlltoAll, its communicator's size unknown
        return True
    return args.get("In split size") == args.get("Out split size") == "[]" and isinstance(args.get("In msg nelems"), int)


def nccl_splits(args: dict) -> tuple[list[int], list[int]] | None:
    """(bytes sent to each group rank, bytes received from each) from NCCL's all-to-all args
    (record_param_comms or its kernel): "In/Out split size" in rows as a JSON string, the row's
    elements from "In/Out msg nelems" over the rows, bytes from "dtype"; None where not recorded
    (an even all-to-all records "[]")."""
    elem = DTYPE_BYTES.get(str(args.get("dtype", "")).lower())
    out = []
    for split_key, nel_key in (("In split size", "In msg nelems"), ("Out split size", "Out msg nelems")):
        raw, nel = args.get(split_key), args.get(nel_key)
        try:
            rows = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            return None
        if not (isinstance(rows, list) and rows and len(rows) <= MAX_GROUP
                and all(isinstance(x, int) and x >= 0 for x in rows) and isinstance(nel, int) and nel >= 0):
            return None
        total = sum(rows)
        if elem is None or (total and nel % total):
            return None
        per_row = nel // total if total else 0
        out.append([x * per_row * elem for x in rows])
    send, recv = out
    return (send, recv) if len(send) == len(recv) else None


def payload_splits(args: dict) -> tuple[int, list[int], list[int]] | None:
    """(communicator rank or -1, bytes sent to each communicator rank, bytes received from each) from
    NCCL's own NVTX payloads of the call's grouped ncclSend/ncclRecv, as the Nsight reader puts them
    (readers/nvtx_payloads.splits); None where the call has none."""
    send, recv = args.get("nccl_peer_send_bytes"), args.get("nccl_peer_recv_bytes")
    if not (isinstance(send, list) and isinstance(recv, list) and send and len(send) == len(recv) <= MAX_GROUP
            and all(isinstance(x, int) and 0 <= x <= 1 << 50 for x in send + recv)):
        return None
    own = args.get("nccl_comm_rank")
    return (own if isinstance(own, int) and 0 <= own < len(send) else -1), send, recv


def a2a_group(calls: Calls, i: int) -> str:
    """The group an all-to-all call's traffic is kept under: its process group, or "all_to_all" where
    the trace names none (the one key the per-rank rows, the cross-rank times and the Perfetto counter share)."""
    return calls.pairs[int(calls.pair[i])][0] or "all_to_all"


def rank_traffic(trace: Trace, calls: Calls, windows: dict[str, list[list[float]]],
                 c10d_args: dict[int, dict] | None = None) -> dict:
    """Per phase and group: this rank's group rank (None: the source does not say), and for each
    sized all-to-all call inside the phase's windows its match key k (calls.py) with the bytes sent
    to and received from each group rank; `calls` counts every all-to-all there, `unsized` those
    whose sizes the trace does not hold, `axes` the calls per axis (EP, or CP for sequence-parallel
    attention), `missing` the reader's reason where its format left the sizes out (None: not known).
    `c10d_args`: event -> args of torch's all-to-all ops (Trace.a2a_args)."""
    if calls.event is None or not len(calls):
        return {}
    a2a = np.flatnonzero(calls.op() == "all_to_all")
    if not len(a2a):
        return {}
    spans = {ph: (np.array([a for a, _ in w]), np.array([b for _, b in w])) for ph, w in windows.items() if w}
    missing = (trace.extra or {}).get("a2a_sizes_missing")  # the reader's word on why its format has no sizes here
    out: dict[str, dict] = {}
    for i in a2a.tolist():
        start = float(calls.start[i])
        phase = next((ph for ph, (lo, hi) in spans.items()
                      if (j := int(np.searchsorted(lo, start, "right")) - 1) >= 0 and start <= hi[j]), None)
        if phase is None:
            continue
        ev = int(calls.event[i])
        got = own_span_splits(trace.names[trace.name_id[ev]])
        args = (c10d_args or {}).get(ev) if got is None else None
        if args:
            sr = c10d_splits(args) or nccl_splits(args)
            got = (-1, *sr) if sr is not None else payload_splits(args)
        g = out.setdefault(phase, {}).setdefault(a2a_group(calls, i), {"grank": None, "calls": 0, "unsized": 0,
                                                                      "even": 0, "k": [], "send": [], "recv": [],
                                                                      "axes": {}, "missing": missing})
        g["calls"] += 1
        axis = calls.kinds[int(calls.kind[i])][1]
        g["axes"][axis] = g["axes"].get(axis, 0) + 1
        if got is None and args and even_split(args):
            g["even"] += 1
            continue
        if got is None or (g["send"] and len(got[1]) != len(g["send"][0])):
            g["unsized"] += 1
            continue
        if got[0] >= 0:
            g["grank"] = got[0]
        g["k"].append(int(calls.k[i]))
        g["send"].append(got[1])
        g["recv"].append(got[2])
    for groups in out.values():  # calls x group ranks: one array each, cheap to ship and to line up
        for g in groups.values():
            g["k"] = np.asarray(g["k"], np.int64)
            width = len(g["send"][0]) if g["send"] else 0
            g["send"], g["recv"] = (np.asarray(g[x], np.int64).reshape(len(g["k"]), width) for x in ("send", "recv"))
    return out
