"""Finding a run's trace files (a directory on disk or at a URL) and the checks one run's set
must pass; loading a directory of Kineto traces onto one clock."""

from __future__ import annotations

import errno
import stat
from pathlib import Path

from . import remote
from .kineto import load_trace
from .model import Trace, TraceError

TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".nsys-rep", ".db", ".rpd", ".rpd.gz")  # Kineto or rocprofv3 JSON;
# Nsight, rocpd, RPD (sources.py)
BUNDLE_FILES = ("manifest.json", "timings.json")  # a bundle's own files, not traces


# vLLM's API-server (front-end) process writes its own trace beside the workers':
# `<prefix>_<host>_<pid>.async_llm.<id>.pt.trace.json.gz`, no rank and no device work (vLLM >= 0.16,
# `--profiler-config`); a worker's carries its coordinates, `dp{d}_pp{p}_tp{t}_dcp{c}_ep{e}_rank{r}`
# (vllm/distributed/utils.py). A front-end trace is not a rank: kept apart and named in the result.
FRONT_END_MARKS = (".async_llm.",)


def is_front_end(name: str) -> bool:
    return any(m in name for m in FRONT_END_MARKS)


def is_trace_name(name: str) -> bool:
    """Whether a file in a run's directory (on disk or at a URL) is one of its rank traces: not a
    bundle's own file, not hidden, not an engine's front-end process."""
    return (name.endswith(TRACE_SUFFIXES) and name not in BUNDLE_FILES and not name.startswith(".")
            and not is_front_end(name))


def front_end_files(path: str | Path) -> list[str]:
    """The engine front-end traces in a run's directory, which `trace_files` leaves out."""
    if remote.is_url(path):
        return []  # listed only on disk; at a URL they are left out all the same
    p = Path(path)
    if not p.is_dir():
        return []
    try:
        return sorted(str(f) for f in p.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES)
                      and is_front_end(f.name))
    except OSError:
        return []


def _trace_files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.is_file() and is_trace_name(p.name))


def trace_files(path: str | Path) -> list[Path | str]:
    """The trace files `path` names: itself, or the rank traces in a directory; an fsspec URL
    (s3://bucket/run/) gives URLs."""
    if remote.is_url(path):
        files = remote.trace_files(path, is_trace_name)
        if not files:
            raise _no_traces(path)
        return files
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise TraceError(f"{path}: a symbolic link loop") from None
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            raise TraceError(f"{path}: no such file or directory") from None
        raise TraceError(f"{path}: cannot read ({e.strerror})") from None
    if stat.S_ISREG(mode):
        return [path]
    if not stat.S_ISDIR(mode):
        raise TraceError(f"{path}: not a regular file or a directory (a FIFO, device or socket)")
    try:
        files = _trace_files(path)
    except OSError as e:
        raise TraceError(f"{path}: cannot list ({e.strerror})") from None
    if not files:
        raise _no_traces(path)
    return files


SNIFF_BYTES = 16 << 20  # JSON this small is parsed whole to tell a trace from another document
HEAD_BYTES = 1 << 20  # where a trace's own keys are looked for first


def not_a_trace(path: Path) -> str | None:
    """Why a JSON file named like a trace is another document (a job's summary, a config, a Flight
    Recorder dump's JSON form), or None where it is or may be a trace. Only a JSON object with none
    of the keys a trace has is another document: a damaged trace (cut short, a bad member) is not
    skipped here, its reader refuses it in one line."""
    import gzip
    import json

    name = path.name
    if not name.endswith((".json", ".json.gz")):
        return None
    try:
        if path.stat().st_size > SNIFF_BYTES:
            return None
        with (gzip.open(path, "rb") if name.endswith(".gz") else open(path, "rb")) as f:
            head = f.read(HEAD_BYTES)
            # a trace says so in its first bytes (a bare list of events; Kineto's traceEvents key follows
            # its few metadata keys; rocprofv3's key comes first): no whole parse of it here, its
            # reader parses it once
            if head.lstrip()[:1] != b"{" or b'"traceEvents"' in head or b'"rocprofiler-sdk-tool"' in head:
                return None
            data = head + f.read(SNIFF_BYTES * 8 + 1 - len(head))
        if len(data) > SNIFF_BYTES * 8:
            return None
        doc = json.loads(data)
    except (OSError, ValueError, EOFError, RecursionError):
        return None  # unreadable or not JSON: its reader says why
    if not isinstance(doc, dict) or "traceEvents" in doc or "rocprofiler-sdk-tool" in doc:
        return None
    if isinstance(doc.get("entries"), list) and ("pg_config" in doc or "version" in doc):
        return "a Flight Recorder dump (read it with `commprobe hang`)"
    keys = ", ".join(list(doc)[:4])
    return f"a JSON object with no traceEvents (keys: {keys}{', ...' if len(doc) > 4 else ''}): not a trace"


def split_traces(files: list) -> tuple[list, list[dict]]:
    """(the files that are or may be traces, [{file, why}] of those that are other documents)."""
    keep, skipped = [], []
    for f in files:
        why = None if remote.is_url(f) else not_a_trace(Path(f))
        if why:
            skipped.append({"file": str(f), "why": why})
        else:
            keep.append(f)
    return keep, skipped


def _no_traces(path) -> TraceError:
    return TraceError(f"{path}: no traces (*.json, *.json.gz, Nsight *.sqlite or *.nsys-rep, rocpd *.db) "
                      f"in this directory{_dumps_hint(path)}")


def _dumps_hint(path) -> str:
    """Where the directory holds Flight Recorder dumps instead (a hung job's), the command that reads them."""
    from .flight_recorder import might_be_dump

    if remote.is_url(path):
        return ""
    try:
        n = sum(1 for i, p in zip(range(4096), Path(path).iterdir()) if p.is_file() and might_be_dump(p))
    except OSError:
        return ""
    return f"; it holds {n} file(s) that look like Flight Recorder dumps: run `commprobe hang {path}`" if n else ""


class RankSet:
    """The checks a directory of one run's traces must pass, fed one rank at a time: no rank twice,
    one world size."""

    def __init__(self, path: Path):
        self.path, self.seen, self.worlds = path, {}, set()

    def add(self, rank: int, file: str, distributed) -> None:
        if rank in self.seen:
            raise TraceError(f"{self.path}: mixed traces: rank {rank} appears in more than one file")
        self.seen[rank] = file
        if isinstance(distributed, dict) and distributed.get("world_size") is not None:
            if distributed["world_size"].__class__ is not int:
                raise TraceError(f"{file}: distributedInfo.world_size is not an integer "
                                 f"({str(distributed['world_size'])[:40]!r})")
            self.worlds.add(distributed["world_size"])
            if len(self.worlds) > 1:
                raise TraceError(f"{self.path}: mixed traces: world sizes {sorted(self.worlds)} in one directory")


def iter_traces(path: str | Path):
    """Load one rank at a time (memory holds one trace, not the run), checking the set as it goes."""
    path = path if remote.is_url(path) else Path(path)
    ranks = RankSet(path)
    for f in trace_files(path):
        t = load_trace(f)
        ranks.add(t.rank, t.path, t.distributed)
        yield t
        del t  # not held while the next rank loads


def load_traces(path: str | Path) -> list[Trace]:
    """One file, or a directory of one run's rank traces, on one clock (the earliest base)."""
    traces = list(iter_traces(path))
    origin = min(t.origin_ns for t in traces)
    for t in traces:  # one clock for the run: shift each rank by its base's distance from the earliest
        t.ts += (t.origin_ns - origin) / 1000.0
        t.origin_ns = origin
    return sorted(traces, key=lambda t: t.rank)
