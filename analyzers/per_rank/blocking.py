"""One collective, one call, and the time it blocks its caller: a pass over a classified trace.

gloo (and any backend that runs a collective's work on its own threads) records a collective
twice: the `c10d::` op the program called, on the calling thread, which only enqueues the work,
and the backend's `gloo:<op>` on its worker thread, which runs it. Read as two calls, every
collective counts twice (a real SGLang TP=2 server: 302 calls against 151). Here each backend op
is paired with the c10d op it runs (the one that started last before it, as `inherit_c10d`
pairs them) and is no call of its own: the call is the c10d op, from the program's entry to the
end of its work.

The caller then blocks in `Work.wait()`, which a trace with Python stacks records as the Python
call `<built-in method wait of ...>` right after the c10d op returns, both inside torch's own API
frame (`distributed_c10d.py(N): all_reduce`). Where that frame is recorded it is the collective's
time on its thread (communication, of the c10d op's category: what a careful reading of a real
SGLang server's trace counts), else the wait after the op; the call ends when it ends; the
backend's worker-thread op of such a call is then not the caller's time and leaves the host timeline (on gloo it runs while the caller may still compute). Where no wait is
recorded, the worker op stays the evidence of the collective's time, as before.

The axis of a collective whose op alone told it (inferred) is taken from the function that called
it where the trace records Python frames: the tensor-parallel API of vLLM and SGLang
(`tensor_model_parallel_all_reduce`, `..._all_gather`, `attention_tensor_model_parallel_...`)
says TP for an all-gather the op alone would call "other".
"""

from __future__ import annotations

import re

import numpy as np

from commprobe.common.vocab import AxisSource, Category, category_for

from ..readers.model import Trace
from .context import is_c10d, pair_backend_work

MARKER = int(Category.MARKER)
INFERRED, UNKNOWN = int(AxisSource.INFERRED), int(AxisSource.UNKNOWN)
WAIT_GAP_US = 500.0  # a wait this soon after its c10d op returns is that op's (Python's own step between them)
_WAIT = "<built-in method wait of"
# the calling function's name -> the axis it declares (vLLM's and SGLang's parallel_state API)
_CALLER_AXES = ((re.compile(r"\btensor_model_parallel_|\battention_tensor_model_parallel_|\bget_tp_group\b"), "tp"),
                (re.compile(r"\bexpert_parallel_|\bep_group\b"), "ep"))


def count_once(trace: Trace, category: np.ndarray, comm_idx: np.ndarray, comm_op: np.ndarray, comm_axis: np.ndarray,
               axis_source: np.ndarray, comm_bytes: np.ndarray, host_timeline: bool) -> tuple[np.ndarray, list[str]]:
    """Per event, the end of the call it begins where that is later than its own end (NaN
    elsewhere): a c10d op's blocking wait or its backend work. Backend ops paired with a c10d op
    lose their op (no call of their own) and lend it their size where it records none; waits take
    their c10d op's category. Returns the ends and what was done, in words."""
    call_end = np.full(len(trace.ts), np.nan)
    notes: list[str] = []
    if not comm_idx.size:
        return call_end, notes
    c10d = comm_idx[trace.events_named(comm_idx, is_c10d)]
    if not c10d.size:
        return call_end, notes
    c10d = c10d[np.argsort(trace.ts[c10d], kind="stable")]
    ends = trace.ts + trace.dur
    notes += _caller_axes(trace, c10d, category, comm_op, comm_axis, axis_source)
    framed = _frames(trace, c10d, ends, category, comm_op, comm_axis, axis_source, call_end)
    waited = _waits(trace, c10d, ends, category, comm_op, comm_axis, axis_source, call_end)
    if framed:
        notes.append(f"{framed} collective(s) timed by their torch.distributed call (a Python frame: checks, enqueue "
                     f"and Work.wait() together), the time their caller spends in them")
    if waited:
        notes.append(f"{waited} collective(s) block their caller in Work.wait() (recorded as a Python call): that "
                     f"wait is their time on the calling thread")
    timed = ~np.isnan(call_end)  # the calls whose blocking time on their caller's thread is recorded
    paired = 0
    for i, k in zip(*pair_backend_work(trace, comm_idx)):
        if comm_op[k] is None:
            continue
        paired += 1
        comm_op[i] = None  # the c10d op is the call; its work is no second one
        if np.isnan(comm_bytes[k]):  # a TensorList's size is recorded on the work's tensor
            comm_bytes[k] = comm_bytes[i]
        if not timed[k]:  # no recorded wait: the call runs until its work ends
            call_end[k] = np.fmax(call_end[k], max(ends[k], ends[i]))
        elif host_timeline:
            category[i] = MARKER  # the caller's wait is its time; the worker's run is not the caller's
    if paired:
        notes.append(f"{paired} backend op(s) on worker threads are the work of the c10d op called: one call each")
    return call_end, notes


_API_FRAME = re.compile(r"(?:^|/)torch/distributed/distributed_c10d\.py\(\d+\): \w+$")


def _frames(trace: Trace, c10d: np.ndarray, ends: np.ndarray, category, comm_op, comm_axis, axis_source,
            call_end) -> int:
    """Each c10d op's enclosing call of torch.distributed's own API (`distributed_c10d.py(N):
    all_reduce`, a Python frame on its thread): argument checks, the enqueue and `Work.wait()`
    together, the time the program spends in the collective. It takes the op's category and the
    call ends with it."""
    is_api = np.fromiter((bool(_API_FRAME.search(n)) for n in trace.names), bool, len(trace.names))
    frames = np.flatnonzero(is_api[trace.name_id])
    if not frames.size:
        return 0
    frames = frames[np.argsort(trace.ts[frames], kind="stable")]
    n = 0
    for k in c10d.tolist():
        if comm_op[k] is None:
            continue
        j = int(np.searchsorted(trace.ts[frames], trace.ts[k], side="right")) - 1
        for f in frames[max(0, j - 64):j + 1][::-1].tolist():  # the innermost that holds it, among the latest
            if trace.tid_id[f] == trace.tid_id[k] and ends[f] >= ends[k]:
                category[f], comm_axis[f], axis_source[f] = category[k], comm_axis[k], axis_source[k]
                call_end[k] = ends[f]
                n += 1
                break
    return n


def _waits(trace: Trace, c10d: np.ndarray, ends: np.ndarray, category, comm_op, comm_axis, axis_source,
           call_end) -> int:
    """Pair each recorded `Work.wait()` with the c10d op on its thread that returned just before it."""
    is_wait = np.fromiter((n.startswith(_WAIT) for n in trace.names), bool, len(trace.names))
    waits = np.flatnonzero(is_wait[trace.name_id])
    if not waits.size:
        return 0
    n = 0
    for tid in np.unique(trace.tid_id[c10d]).tolist():
        ops = c10d[trace.tid_id[c10d] == tid]
        ws = waits[trace.tid_id[waits] == tid]
        if not ws.size:
            continue
        j = np.searchsorted(trace.ts[ops], trace.ts[ws], side="right") - 1
        for w, k in zip(ws[j >= 0].tolist(), ops[j[j >= 0]].tolist()):
            gap = trace.ts[w] - ends[k]
            if comm_op[k] is None or not 0.0 <= gap <= WAIT_GAP_US or not np.isnan(call_end[k]):
                continue
            category[w], comm_axis[w], axis_source[w] = category[k], comm_axis[k], axis_source[k]
            call_end[k] = ends[w]
            n += 1
    return n


def _caller_axes(trace: Trace, c10d: np.ndarray, category, comm_op, comm_axis, axis_source) -> list[str]:
    """An inferred axis from the calling function's name, where an enclosing frame on the same
    thread names one (_CALLER_AXES)."""
    frames = []
    for pattern, axis in _CALLER_AXES:
        hit = np.fromiter((bool(pattern.search(n)) for n in trace.names), bool, len(trace.names))
        idx = np.flatnonzero(hit[trace.name_id])
        if idx.size:
            frames.append((idx, axis))
    if not frames:
        return []
    changed: dict[tuple[str, str], int] = {}
    ends = trace.ts + trace.dur
    for idx, axis in frames:
        idx = idx[np.argsort(trace.ts[idx], kind="stable")]
        for k in c10d.tolist():
            if comm_op[k] is None or axis_source[k] not in (INFERRED, UNKNOWN) or comm_axis[k] == axis:
                continue
            j = int(np.searchsorted(trace.ts[idx], trace.ts[k], side="right")) - 1
            while j >= 0 and trace.ts[k] - trace.ts[idx[j]] < 1e7:  # enclosing frames start before it
                f = idx[j]
                if trace.tid_id[f] == trace.tid_id[k] and ends[f] >= ends[k]:
                    key = (comm_op[k], axis)
                    changed[key] = changed.get(key, 0) + 1
                    comm_axis[k], category[k], axis_source[k] = axis, category_for(comm_op[k], axis), INFERRED
                    break
                j -= 1
    return [f"{n} {op} call(s) are {axis.upper()}: the function that called them is "
            f"{'a tensor-parallel' if axis == 'tp' else 'an expert-parallel'} one (vLLM's / SGLang's parallel API)"
            for (op, axis), n in sorted(changed.items())]
