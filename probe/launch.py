"""Start ranks on one host with torch's own spawn; run as one rank under torchrun.

One host: `launch()` spawns `world_size` processes through `torch.multiprocessing`'s spawn
context, rendezvous over a file store (no port to collide with), and watches them. A rank
that raises, dies from a signal or outlives `timeout` ends the run with a `LaunchError`
naming the rank and the cause; the other ranks are stopped and whatever they already wrote
stays on disk. Many hosts: torchrun (the existing engine) starts the processes and sets
RANK/WORLD_SIZE/MASTER_ADDR; `under_torchrun()` detects that and `run_this_rank()` runs the
same worker function in the current process. We never write a multi-host launcher.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from itertools import count
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from commprobe.collectives.backends import process_group_backend
from commprobe.common.bundle import FR_TRIGGER, fr_dump_name

_launches = count()


class LaunchError(RuntimeError):
    """A rank failed; `rank` is None when the cause concerns the whole job."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank
        self.finding: str | None = None  # the hang diagnosis's first finding, where the bundle has records


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def _init_rank(backend: str, timeout: float, init_method: str, rank: int, world: int) -> None:
    torch.set_num_threads(1)  # one core's worth per rank: ranks share a small host
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout))


def run_this_rank(fn: Callable[..., Any], args: tuple = (), *, backend: str | None = None, timeout: float = 300,
                  gather: bool = False) -> Any:
    """Under torchrun: initialise from the environment and run `fn` for this process's rank.

    With `gather`, every rank gets the list of all ranks' results (rank order).
    """
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _init_rank(backend or process_group_backend(), timeout, "env://", rank, world)
    try:
        result = fn(*args)
        if not gather:
            return result
        everyone: list = [None] * world
        dist.all_gather_object(everyone, result)
        return everyone
    finally:
        dist.destroy_process_group()


_progress_count = 0


def report_progress(label: str) -> None:
    """Record how far this rank got; on a timeout the launcher names the rank furthest behind.

    Call it before each phase and collective-bearing step. No-op outside `launch()`.
    """
    global _progress_count
    d = os.environ.get("COMMPROBE_PROGRESS_DIR")
    if not d:
        return
    _progress_count += 1
    p = Path(d) / f"rank{os.environ.get('RANK', '0')}.progress"
    tmp = p.with_suffix(".tmp")
    tmp.write_text(f"{_progress_count} {label}")
    tmp.replace(p)


def _read_progress(out: Path, rank: int) -> tuple[int, str]:
    try:
        n, _, label = (out / f"rank{rank}.progress").read_text().partition(" ")
        return int(n), label
    except (OSError, ValueError):
        return 0, "start-up"


def _hang_message(out: Path, alive: list[int], timeout: float) -> tuple[str, int | None]:
    if not alive:
        return f"the run did not finish within {timeout:g} s (timeout)", None
    prog = {r: _read_progress(out, r) for r in alive}
    behind = min(n for n, _ in prog.values())
    hung = [r for r in alive if prog[r][0] == behind]
    waiting = [r for r in alive if r not in hung]
    who = "rank" if len(hung) == 1 else "ranks"
    msg = f"{who} {', '.join(map(str, hung))} hung after '{prog[hung[0]][1]}' (timeout {timeout:g} s)"
    if waiting:
        msg += "; " + ", ".join(f"rank {r} waiting at '{prog[r][1]}'" for r in waiting)
    return msg, hung[0]


def _child(rank: int, world: int, init_file: str, fn: Callable, args: tuple, out: str, backend: str, timeout: float,
           shm_tag: str, capture: bool, forensics: str | None = None, live: str | None = None) -> None:
    if capture:  # the rank's own output goes to a log beside its results, not the user's terminal
        log = os.open(os.path.join(out, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      COMMPROBE_SHM_TAG=shm_tag, COMMPROBE_PROGRESS_DIR=out)
    outp = Path(out)
    if forensics:  # record collectives; dump records and stacks when the launcher asks (probe/forensics.py)
        import faulthandler

        from . import forensics as fr

        fr.enable()
        faulthandler.enable(all_threads=True)  # a rank killed by a C++ abort still leaves its stacks in its log
    if live:  # its records (with forensics) and stacks asked while it runs (commprobe hang --live)
        from . import forensics as live_fr

        try:
            live_fr.serve(os.path.join(live, f"rank-{rank}.sock"))
        except Exception:  # noqa: BLE001 - a run is never failed for want of a live endpoint
            pass
    try:
        _init_rank(backend, timeout, f"file://{init_file}", rank, world)
        if forensics:
            fr.start_watcher(out, forensics, rank)
        result = fn(*args)
        tmp = outp / f"rank{rank}.pkl.tmp"
        tmp.write_bytes(pickle.dumps(result))
        tmp.rename(outp / f"rank{rank}.pkl")
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - everything a rank raises is reported by the parent
        (outp / f"rank{rank}.traceback").write_text(traceback.format_exc())
        (outp / f"rank{rank}.err").write_text(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip())
        if forensics:
            try:  # this rank's own records and where it failed, before it is gone
                fr.dump(Path(forensics), rank, exc=e)
            except Exception:  # noqa: BLE001 - the failure itself is what gets reported
                pass
        os._exit(1)
    # The result is safe on disk: skip interpreter teardown, where third-party extensions' static
    # destructors can abort (DeepSpeed's shm op: "terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _describe_exit(code: int, errfile: Path) -> str:
    if errfile.exists():
        return errfile.read_text().strip() or "raised an exception"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _collect_forensics(out: Path, forensics: Path | None, procs: list, wait: float = 10.0) -> None:
    """Ask every live rank for its Flight Recorder records and stacks (the trigger file its watcher
    thread polls for) and wait, at most `wait` seconds, until each has written them or died."""
    if forensics is None:
        return
    (out / FR_TRIGGER).touch()
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        pending = [r for r, p in enumerate(procs) if p.is_alive() and not (forensics / fr_dump_name(r)).exists()
                   and not (forensics / f"rank{r}.dump-error").exists()]
        if not pending:
            return
        time.sleep(0.05)


def _stop(procs: list, grace: float = 2.0) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1.0)


def launch(fn: Callable[..., Any], world_size: int, args: tuple = (), *, backend: str | None = None,
           timeout: float = 300.0, workdir: str | Path | None = None,
           on_poll: Callable[[], None] | None = None,
           on_start: Callable[[dict[int, int]], None] | None = None, capture_output: bool = False,
           forensics: str | Path | None = None) -> list[Any]:
    """Run `fn(*args)` on `world_size` spawned ranks; return each rank's result, in rank order.

    `fn` must be importable (a module-level function). Raises LaunchError naming the first
    rank that failed, or the ranks still running when `timeout` seconds ran out. `on_poll` is
    called from the watching loop (a progress bar reads the ranks' progress there);
    `on_start` gets {rank: pid} once all ranks are started (telemetry samples them);
    `capture_output` sends each rank's stdout/stderr to `rank{r}.log` in the work directory.
    `forensics`: ranks record to torch's Flight Recorder, and when a rank hangs or fails every live
    rank's records and Python stacks are written there before the ranks are stopped (a rank that
    raises writes its own on the way out).
    """
    backend = backend or process_group_backend()
    own_dir = workdir is None
    out = Path(tempfile.mkdtemp(prefix="commprobe-launch-")) if own_dir else Path(workdir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    init_file = out / "rendezvous"
    init_file.unlink(missing_ok=True)
    ctx = mp.get_context("spawn")
    shm_tag = f"{os.getpid()}x{next(_launches)}"
    fr_dir = Path(forensics).resolve() if forensics else None
    (out / FR_TRIGGER).unlink(missing_ok=True)  # a trigger left by an earlier run in this directory
    run_root = fr_dir.parent if fr_dir else (out.parent if not own_dir else None)  # where live.json goes
    live = _live_sockets(run_root, world_size)
    procs = [ctx.Process(target=_child, args=(r, world_size, str(init_file), fn, args, str(out), backend, timeout, shm_tag,
                                                    capture_output, str(fr_dir) if fr_dir else None,
                                                    str(live) if live else None),
                         name=f"commprobe-rank{r}") for r in range(world_size)]
    try:
        for p in procs:
            p.start()
        if on_start is not None:
            on_start({r: p.pid for r, p in enumerate(procs)})
        deadline = time.monotonic() + timeout
        while True:
            failed = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if failed:
                # Prefer a rank that raised on its own over peers that merely lost their connection to it.
                primary = sorted(failed, key=lambda f: _is_secondary(out / f"rank{f[0]}.err"))[0]
                r, code = primary
                _collect_forensics(out, fr_dir, procs)
                _stop(procs)
                raise LaunchError(f"rank {r} failed: {_describe_exit(code, out / f'rank{r}.err')}", rank=r)
            if all(p.exitcode == 0 for p in procs):
                break
            if time.monotonic() > deadline:
                alive = [r for r, p in enumerate(procs) if p.is_alive()]
                msg, culprit = _hang_message(out, alive, timeout)
                _collect_forensics(out, fr_dir, procs)
                _stop(procs)
                raise LaunchError(msg, rank=culprit)
            if on_poll is not None:
                on_poll()
            time.sleep(0.02)
        results = []
        for r in range(world_size):
            f = out / f"rank{r}.pkl"
            if not f.exists():
                raise LaunchError(f"rank {r} exited without a result", rank=r)
            results.append(pickle.loads(f.read_bytes()))
        return results
    except KeyboardInterrupt:
        _stop(procs, grace=1.0)
        raise
    finally:
        _stop(procs)
        _remove_shared_memory(shm_tag)
        if live:  # the run is over: nothing answers there any more
            from commprobe.common.bundle import LIVE_SOCKETS

            shutil.rmtree(live, ignore_errors=True)
            (run_root / LIVE_SOCKETS).unlink(missing_ok=True)
        if own_dir:
            shutil.rmtree(out, ignore_errors=True)


def _live_sockets(root: Path | None, world: int) -> Path | None:
    """Where the ranks of a run answer while it runs, published in `root`'s live.json (the run
    directory: a bundle's, or a bench's work directory; probe/forensics.py); None where there is no
    run directory or the sockets' directory cannot be made."""
    if root is None:
        return None
    from . import forensics as fr

    try:
        d = fr.socket_dir(root)
        fr.publish(root, {r: str(d / f"rank-{r}.sock") for r in range(world)})
        return d
    except OSError:
        return None


def _remove_shared_memory(tag: str) -> None:
    """Ranks unlink their segments once mapped; this catches one that died before it could."""
    from commprobe.collectives.dda import SHM_PREFIX, shm_dir

    for f in shm_dir().glob(f"{SHM_PREFIX}-{tag}-*"):
        f.unlink(missing_ok=True)


def _is_secondary(errfile: Path) -> bool:
    """True for errors a rank gets only because a peer went away first."""
    if not errfile.exists():
        return False  # died without raising (a signal): that is a first cause, not a consequence
    text = errfile.read_text()
    return any(s in text for s in ("Connection closed by peer", "Connection reset", "Broken pipe", "DistBackendError"))
