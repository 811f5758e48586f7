"""Hang forensics, rank side: every rank records its collectives to torch's Flight Recorder, and a
watcher thread dumps those records and the rank's Python stacks when the launcher asks.

Why a thread and a trigger file. A rank that hangs sits in C++ (a gloo or NCCL wait) or in a
sleep, with the GIL released; a Python signal handler would run only when that call returns,
which it never does. A daemon thread can still take the GIL and call torch's in-process dump
(`torch._C._distributed_c10d._dump_fr_trace`, which returns the same pickle torch writes on an
NCCL timeout, with each entry's Python frames) and read every thread's current frames
(`sys._current_frames`). It polls for the trigger every 50 ms, sleeping in between, so waiting
ranks still yield the core.

Facts checked on torch 2.13 with gloo (tests/test_hang.py): gloo records to the Flight Recorder
when TORCH_FR_BUFFER_SIZE is set (the older TORCH_NCCL_TRACE_BUFFER_SIZE is an alias); entries
carry pg_id, process_group (name, desc), collective_seq_id, profiling_name ("gloo:all_reduce"),
input/output sizes and dtypes, retired, frames; state stays "scheduled" and there are no
start/end times; pg_config has empty names (the group name is set after gloo's backend is
built), so each rank also writes which of its process groups is which axis (`write_groups`).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

from commprobe.common.bundle import FR_TRIGGER, fr_dump_name, fr_groups_name, fr_stacks_name

BUFFER_ENTRIES = "2000"  # records kept per rank (a ring): a decode step of a deep model is a few hundred


def enable() -> None:
    """Ask torch to record collectives (before the process group is created); a user's own
    setting wins."""
    if not (os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")):
        os.environ["TORCH_FR_BUFFER_SIZE"] = BUFFER_ENTRIES


_GROUPS: dict = {}  # this rank's process groups by axis (register_groups), written with each dump


def start_watcher(trigger_dir: str | Path, out: str | Path, rank: int) -> threading.Thread:
    """A daemon thread that dumps this rank's records and stacks into `out` once the trigger file
    appears in `trigger_dir` (the launcher's work directory)."""
    trigger = Path(trigger_dir) / FR_TRIGGER

    def watch() -> None:
        while not trigger.exists():
            time.sleep(0.05)
        try:
            dump(Path(out), rank)
        except Exception as e:  # noqa: BLE001 - a failed dump is reported beside the others, never raised here
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / f"rank{rank}.dump-error").write_text(f"{type(e).__name__}: {e}")

    t = threading.Thread(target=watch, name="commprobe-flight-recorder", daemon=True)
    t.start()
    return t


def dump(directory: Path, rank: int, exc: BaseException | None = None) -> None:
    """This rank's Flight Recorder pickle, every thread's Python stack (outermost frame first) and
    its process groups, each written atomically. `exc`: the rank is failing with it; its
    traceback stands for the main thread's stack (where it failed, not the handler)."""
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    main = threading.main_thread().ident
    stacks = []
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident() and exc is None:
            continue  # the dumping thread itself
        summary = (traceback.extract_tb(exc.__traceback__) if exc is not None and ident == main
                   else traceback.extract_stack(frame))
        stacks.append({"thread": "main" if ident == main else _thread_name(ident), "main": ident == main,
                       "frames": [{"file": f.filename, "line": f.lineno, "name": f.name} for f in summary]})
    doc = {"rank": rank, "pid": os.getpid(), "job": os.environ.get("COMMPROBE_SHM_TAG"), "stacks": stacks,
           "error": f"{type(exc).__name__}: {exc}" if exc is not None else None}
    _atomic(directory / fr_stacks_name(rank), json.dumps(doc, default=str).encode())
    if _GROUPS:
        _atomic(directory / fr_groups_name(rank), json.dumps({"rank": rank, "groups": _GROUPS}).encode())
    data = torch._C._distributed_c10d._dump_fr_trace()
    _atomic(directory / fr_dump_name(rank), bytes(data))


def register_groups(comms: dict) -> None:
    """Which process group (by the name the Flight Recorder records) is which axis, with its global
    ranks, kept for the dumps: gloo's own pg_config leaves the names empty. `comms`: axis -> a Comm
    with `.group` (None: the default group) and `.ranks` (wrappers with `.inner` are looked through)."""
    import torch.distributed as dist

    groups = _GROUPS
    for axis, comm in comms.items():
        inner = comm
        while hasattr(inner, "inner"):
            inner = inner.inner
        pg = getattr(inner, "group", None) or dist.group.WORLD
        ranks = list(getattr(inner, "ranks", None) or range(dist.get_world_size()))
        groups.setdefault(pg.group_name, {"axis": axis, "ranks": ranks})
    world = dist.group.WORLD.group_name
    groups.setdefault(world, {"axis": "world", "ranks": list(range(dist.get_world_size()))})


def _thread_name(ident: int) -> str:
    return next((t.name for t in threading.enumerate() if t.ident == ident), str(ident))


def _atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# ---- live answers (issue 59): each rank serves its records and stacks while it runs ----

def socket_dir(root: Path) -> Path:
    """A short directory only this user can enter for a run's rank sockets: a unix socket's path
    is limited to 107 bytes, which a run directory's often passes, so the sockets live under the
    runtime directory (or /tmp) and the run's live.json says where."""
    import hashlib

    base = Path(os.environ.get("XDG_RUNTIME_DIR") or "/tmp") / f"commprobe-live-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    os.chmod(base, 0o700)
    d = base / hashlib.sha1(f"{Path(root).resolve()}:{os.getpid()}".encode()).hexdigest()[:12]
    d.mkdir(mode=0o700, exist_ok=True)
    return d


def publish(root: Path, sockets: dict[int, str]) -> Path:
    """Write the run's live.json (which socket each rank answers on): `commprobe hang --live RUN`."""
    from commprobe.common.bundle import LIVE_SOCKETS

    f = Path(root) / LIVE_SOCKETS
    f.write_text(json.dumps({"sockets": {str(r): s for r, s in sockets.items()}}))
    return f


_SERVER = None  # kept for the life of the rank: the server stops when it is collected


def serve(path: str) -> None:
    """Serve this rank's Flight Recorder records and Python stacks on the unix socket `path`
    (torch's _WorkerServer: fr_trace_json, dump_traceback; never a TCP port: torch's
    start_debug_server binds every interface with no authentication)."""
    global _SERVER
    from torch._C._distributed_c10d import _WorkerServer

    _SERVER = _WorkerServer(path)
    os.chmod(path, 0o600)
