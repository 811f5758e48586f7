"""CUDA/HIP graphs in a trace: replays, capture, and replays whose kernels were not recorded.

Engines (vLLM, SGLang, TensorRT-LLM) decode by replaying graphs: one `cudaGraphLaunch` /
`hipGraphLaunch` on the host, the graph's kernels on the device. A trace of the capture alone
(stream capture, instantiation, no replay), or one whose profiler did not record the replayed
kernels, shows a device idle between launches that it never was: the verdict must say so
instead of calling the step launch-bound and recommending graphs it already uses.
"""

from __future__ import annotations

import numpy as np

from ..readers.model import Trace


def _named(trace: Trace, low: list[str], *needles: str) -> np.ndarray:
    ids = [i for i, n in enumerate(low) if ("graph" in n or "capture" in n) and any(x in n for x in needles)]
    return np.flatnonzero(np.isin(trace.name_id, ids) & ~trace.is_device()) if ids else np.zeros(0, np.int64)


def graph_facts(trace: Trace) -> dict:
    """Counts per rank: graph launches (replays), capture/instantiate calls, and replays after which
    no kernel starts on the device before the next replay (their kernels are missing)."""
    low = [n.lower() for n in trace.names]
    launches = _named(trace, low, "graphlaunch")
    capture = _named(trace, low, "streambegincapture", "streamendcapture", "graphinstantiate")
    kernels = trace.ts[trace.is_device_work()]  # the trace's events are sorted by start
    empty = 0
    if len(launches):
        t = np.sort(trace.ts[launches])
        nxt = np.r_[t[1:], np.inf]
        first_after = np.searchsorted(kernels, t, side="left")
        starts = np.r_[kernels, np.inf][first_after]
        empty = int((starts >= nxt).sum())
    state = "none"
    if len(launches) and empty > len(launches) / 2:
        state = "replays-without-kernels"
    elif len(launches):
        state = "replays"
    elif len(capture):
        state = "capture-only"
    return {"launches": int(len(launches)), "capture_calls": int(len(capture)), "empty_replays": empty, "state": state}
