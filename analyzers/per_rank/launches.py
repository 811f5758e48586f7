"""Evidence that a rank drove a device, read from its host side alone: what tells a trace whose
device timeline is *missing* (the work was launched and not recorded: torch.profiler without
ProfilerActivity.CUDA, a legacy export, device events stripped) from a CPU-only workload (gloo,
no launches), whose host timeline is the whole story.

Three kinds, each counted, none guessed: runtime launch calls (cudaLaunchKernel, cuLaunchKernel,
hipLaunchKernel, cudaGraphLaunch, async copies: by their runtime category or their name), runtime
calls that carry a launch correlation id (the id Kineto's cpu->device `ac2g` flows carry), and the
host ops of a device collective library (`nccl:all_reduce`, `rccl:...`); a process group whose
backend is NCCL/RCCL in `distributedInfo` is reported beside them, not evidence on its own."""

from __future__ import annotations

import re

import numpy as np

from ..readers.model import RUNTIME_CATS, Trace

_LAUNCH = re.compile(r"^(?:cuda|cu|hip|hipExt)\w*(?:Launch\w*|MemcpyAsync|MemsetAsync|Memcpy\w*Async)\b|"
                     r"^(?:cuda|hip)GraphLaunch\b", re.ASCII)
_DEVICE_COLLECTIVE = re.compile(r"^(?:nccl|rccl):|^nccl[A-Z]\w*|^rccl[A-Z]\w*", re.ASCII)
DEVICE_BACKENDS = ("nccl", "rccl", "xccl", "hccl")


def device_launches(trace: Trace) -> dict:
    """Counts of the host-side evidence of device work in one rank's trace (all zero: none)."""
    names = trace.names
    launch_name = np.fromiter((bool(_LAUNCH.match(n)) for n in names), bool, len(names))
    coll_name = np.fromiter((bool(_DEVICE_COLLECTIVE.match(n)) for n in names), bool, len(names))
    runtime_cat = np.fromiter((c in RUNTIME_CATS for c in trace.cats), bool, len(trace.cats))
    if not len(trace.ts):
        return {"launch_calls": 0, "correlated_calls": 0, "device_collective_calls": 0, "backend": None}
    host = ~trace.is_device()
    launch = host & (launch_name[trace.name_id] if len(names) else False)
    runtime = host & (runtime_cat[trace.cat_id] if len(trace.cats) else False)
    backend = str((trace.distributed or {}).get("backend") or "").lower() or None
    return {"launch_calls": int((launch | (runtime & launch_name[trace.name_id])).sum()),
            "correlated_calls": int(((runtime | launch) & (trace.arg_corr >= 0)).sum()),
            "device_collective_calls": int((host & coll_name[trace.name_id]).sum()) if len(names) else 0,
            "backend": backend if backend in DEVICE_BACKENDS else None}


def drove_a_device(ev: dict) -> bool:
    """Launches or device collectives recorded. A NCCL/RCCL process group alone is not enough: a
    process may set one up and profile a CPU-only part of its work."""
    return bool(ev.get("launch_calls") or ev.get("correlated_calls") or ev.get("device_collective_calls"))


def words(ev: dict) -> str:
    """The evidence in words: '462 runtime launch calls, 4 NCCL/RCCL calls'."""
    parts = []
    if ev.get("launch_calls"):
        parts.append(f"{ev['launch_calls']:,} runtime launch calls")
    if ev.get("correlated_calls") and ev["correlated_calls"] != ev.get("launch_calls"):
        parts.append(f"{ev['correlated_calls']:,} runtime calls correlated to device work")
    if ev.get("device_collective_calls"):
        parts.append(f"{ev['device_collective_calls']:,} NCCL/RCCL calls")
    if ev.get("backend") and not ev.get("device_collective_calls"):
        parts.append(f"a {ev['backend'].upper()} process group")
    return ", ".join(parts)
