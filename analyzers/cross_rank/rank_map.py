"""The per-rank *map* of an analysis: the per-rank pipeline (per_rank/pipeline.py: one trace in,
a compact summary out) run over every file, so that the cross-rank *reduce* (analysis.py: clocks, matching, straggler wait,
verdicts) never holds a rank's event columns. The map runs in this process, with
`jobs > 1` in a local pool of processes, or on a Dask distributed cluster, one rank per task;
results come back in file order, so the analysis is the same wherever the map ran. Dask
because Nsight Systems' multi-report recipes use it and it already runs on SLURM and Kubernetes.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from commprobe.common.host import usable_cores

from ..per_rank import pipeline
from ..per_rank.classify import Rule
from ..per_rank.pipeline import RankSummary
from ..readers import remote
from ..readers.model import TraceError


def summarize(file: str | Path, rules: list[Rule] = (), rank_from: str | None = None,
              coords: dict[int, dict[str, int]] | None = None) -> list[RankSummary]:
    """The map's task: the per-rank pipeline over one file, with the map's own concerns around it
    (injected faults for tests, glibc's thresholds under a Dask nanny)."""
    _fault(file)
    with _roomy_malloc():
        return pipeline.summarize(file, rules, rank_from, coords)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
_malloc_lock = threading.Lock()
_malloc_users = 0


@contextmanager
def _roomy_malloc():
    """Let glibc keep freed memory for reuse while a rank is analyzed, where the environment
    forbade it. Dask's nanny starts every worker with MALLOC_TRIM_THRESHOLD_=65536
    (distributed.nanny.pre-spawn-environ) to hand memory back to the OS; setting it also freezes
    glibc's mmap threshold at 128 KB, so each numpy array above that is a fresh mmap, zero-filled
    page by page: the map ran ~1.65x slower in a Dask worker than in a pool worker (bench/RESULTS.md).
    For the task's duration the thresholds are raised; after the last concurrent task the
    environment's values come back and the heap is trimmed, as the worker asked."""
    global _malloc_users
    trim = os.environ.get("MALLOC_TRIM_THRESHOLD_")
    libc = _libc() if trim is not None else None
    if libc is None:
        yield
        return
    with _malloc_lock:
        _malloc_users += 1
        if _malloc_users == 1:
            libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # glibc's largest (HEAP_MAX_SIZE / 2)
            libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    try:
        yield
    finally:
        with _malloc_lock:
            _malloc_users -= 1
            if _malloc_users == 0:
                mmap = os.environ.get("MALLOC_MMAP_THRESHOLD_", "")
                libc.mallopt(_M_MMAP_THRESHOLD, int(mmap) if mmap.isdigit() else 128 << 10)
                libc.mallopt(_M_TRIM_THRESHOLD, int(trim) if trim.isdigit() else 128 << 10)
                libc.malloc_trim(0)


@lru_cache(maxsize=1)
def _libc():
    """glibc, when this process runs on it (mallopt is glibc's); None elsewhere (musl, macOS)."""
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def map_ranks(files: list[Path], rules: list[Rule] = (), jobs: int = 1, scheduler: str | None = None,
              rank_from: str | None = None, coords: dict[int, dict[str, int]] | None = None):
    """Summaries of `files`, in their order: in this process (one rank in memory at a time), in
    `jobs` worker processes, or as tasks on the Dask cluster at `scheduler`. A worker's error (an
    unreadable trace) is raised here as it was."""
    if scheduler:
        yield from _map_dask(files, rules, scheduler, rank_from, coords)
        return
    jobs = max(1, min(jobs, len(files)))
    if jobs == 1:
        for f in files:
            yield from summarize(f, rules, rank_from, coords)
        return
    yield from _map_pool(files, list(rules), jobs, rank_from, coords)


def _map_pool(files: list[Path], rules: list[Rule], jobs: int, rank_from: str | None, coords: dict | None = None):
    """The map in a local process pool. A worker that dies (killed, out of memory, a crash in a
    native library) breaks the pool: every file not yet summarized is retried once in a new pool;
    if that breaks too, the files run one per pool until the one that kills its worker is found
    and named in one line."""
    from concurrent.futures.process import BrokenProcessPool  # only with a pool: a one-rank analysis starts faster

    done = 0
    for _attempt in range(2):
        try:
            with _pool(jobs) as pool:
                futures = [pool.submit(summarize, f, rules, rank_from, coords) for f in files[done:]]
                for fut in futures:
                    out = fut.result()
                    done += 1
                    yield from out
            return
        except BrokenProcessPool:
            continue
    for f in files[done:]:
        try:
            with _pool(1) as pool:
                out = pool.submit(summarize, f, rules, rank_from, coords).result()
        except BrokenProcessPool:
            raise TraceError(f"{f}: the worker process analyzing it died twice (killed, out of memory, or a crash "
                             f"in a native library)") from None
        yield from out


@contextmanager
def _pool(jobs: int):
    """A process pool that, when the map ends early (Ctrl-C, an unreadable rank, the caller gone),
    kills its workers at once: a worker would otherwise go on with the tasks already queued to it
    before the pool could shut down."""
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(max_workers=jobs)
    try:
        yield pool
    except BaseException:
        for proc in list(getattr(pool, "_processes", {}).values()):  # no public way before Python 3.14
            proc.kill()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _fault(file: str | Path) -> None:
    """COMMPROBE_FAULT=map-die[:NAME] (or map-die-once, map-hang): a map worker process analyzing a
    file whose path contains NAME exits at once (once: only the first time for that file), as a
    worker killed by the OOM killer would, or sleeps an hour; for tests, and for users checking
    what their cluster does. Never in the command's own process."""
    fault = os.environ.get("COMMPROBE_FAULT", "")
    kind, _, who = fault.partition(":")
    if kind not in ("map-die", "map-die-once", "map-hang") or (who and who not in str(file)):
        return
    import multiprocessing

    if multiprocessing.parent_process() is None and not _in_dask_worker():
        return
    if kind == "map-hang":
        import time

        time.sleep(3600)
    if kind == "map-die-once":
        import hashlib
        import tempfile

        key = hashlib.sha1(str(Path(file).resolve()).encode()).hexdigest()[:16]
        marker = Path(tempfile.gettempdir()) / f"commprobe-fault-{key}"
        if marker.exists():
            return
        marker.touch()
    os._exit(9)


def _in_dask_worker() -> bool:
    try:
        from distributed import get_worker

        get_worker()
        return True
    except (ImportError, ValueError):
        return False


CONNECT_TIMEOUT_S = 8  # the whole command answers within 10 s


def _map_dask(files: list[Path], rules: list[Rule], address: str, rank_from: str | None = None,
              coords: dict | None = None):
    """One task per rank on an existing Dask distributed cluster (dask-jobqueue on SLURM,
    dask-kubernetes, or `dask scheduler` + `dask worker` by hand): each worker opens its trace from
    the path (a filesystem the workers share) or the fsspec URL (s3://, gs://: each worker reads with
    its own credentials) and only the summary travels back. A task whose
    worker dies is retried once."""
    try:
        from dask.distributed import Client
    except ImportError:
        raise TraceError("--scheduler needs Dask's distributed scheduler: pip install 'commprobe[cluster]'") from None
    try:
        client = Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as e:
        raise TraceError(f"cannot reach the Dask scheduler at {address} within {CONNECT_TIMEOUT_S} s "
                         f"({type(e).__name__})") from None
    with client:
        futures = client.map(summarize, [f if remote.is_url(f) else str(Path(f).resolve()) for f in files],
                             rules=list(rules), rank_from=rank_from, coords=coords,
                             retries=1, pure=False)
        try:
            for f, fut in zip(files, futures):
                try:
                    yield from fut.result()
                except TraceError:
                    raise
                except Exception as e:  # KilledWorker after the retry, a worker that cannot import us
                    raise TraceError(f"{f}: the Dask task failed twice ({type(e).__name__}: {e})") from None
        finally:
            client.cancel(futures)


def default_jobs() -> int:
    """The usable cores (common.host.usable_cores), COMMPROBE_JOBS overriding."""
    env = os.environ.get("COMMPROBE_JOBS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return usable_cores()
