"""One builder of synthetic Kineto events for every test: complete ('X') events, a kernel with
the runtime call that launched it, record_param_comms as recent PyTorch writes it, and a trace
file with its distributedInfo. Shapes follow what torch.profiler writes (Kineto's
output_json.cpp); tests that need a real producer's output profile one (tests/test_c10d_names.py)."""

from __future__ import annotations

import gzip
import json

HOST, STREAM, SIDE = 1, 7, 20  # host thread, compute stream, communication stream
BASE_NS = 1_700_000_000_000_000_000


def ev(name: str, ts: float, dur: float, tid: int | str, cat: str = "cpu_op", pid: int = 0, **args) -> dict:
    """A complete event; keyword arguments become its args."""
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def kernel(name: str, ts: float, dur: float, stream: int = STREAM, device: int = 0, **args) -> dict:
    return ev(name, ts, dur, stream, "kernel", pid=device, **args)


def launched(name: str, ts: float, dur: float, corr: int, launch_ts: float, stream: int = SIDE,
             api: str = "cudaLaunchKernel", **kargs) -> list[dict]:
    """A kernel and the runtime call that launched it, tied by their correlation id."""
    return [ev(api, launch_ts, 5, HOST, "cuda_runtime", correlation=corr),
            ev(name, ts, dur, stream, "kernel", correlation=corr, **kargs)]


def rpc(ts: float, dur: float, op: str, nelems: int, pg_desc: str = "undefined", group: str = "3",
        seq: int | None = None, group_size: int = 4) -> dict:
    """record_param_comms as recent PyTorch writes it: the collective, its size and its group."""
    args = {"Collective name": op, "In msg nelems": nelems, "Out msg nelems": nelems, "dtype": "Float",
            "Group size": group_size, "Process Group Name": group, "Process Group Description": pg_desc}
    if seq is not None:
        args["Seq"] = seq
    return ev("record_param_comms", ts, dur, HOST, **args)


def write(path, events: list[dict], rank: int | None = 0, world: int = 1, base: int = BASE_NS, backend: str = "nccl"):
    """A gzip Kineto trace of `events` for one rank (rank None: no distributedInfo, as a process that
    never initialized torch.distributed writes it); returns the path."""
    doc = {"schemaVersion": 1, "baseTimeNanoseconds": base, "traceEvents": events}
    if rank is not None:
        doc["distributedInfo"] = {"backend": backend, "rank": rank, "world_size": world}
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path
