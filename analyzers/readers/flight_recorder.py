"""torch's Flight Recorder dumps (one file per rank), read without trusting them.

A dump is torch's pickle (what `TORCH_FR_DUMP_TEMP_FILE` names on an NCCL timeout, or
`torch._C._distributed_c10d._dump_fr_trace()` returns) or its JSON form (`_dump_fr_trace_json`).
Dumps come from other machines, so a pickle is never `pickle.load`ed: its opcodes are checked
first (only the builtin containers and scalars the Flight Recorder writes: dict, list, tuple, str,
bytes, int, float, bool, None) and the unpickler admits no class at all, so a `__reduce__`
payload is refused in one line without running. Format facts (PyTorch
torch/csrc/distributed/c10d/FlightRecorder*.{hpp,cpp}, torch/distributed/flight_recorder/): top
level `version`, `pg_config` {key: {name, desc, ranks}}, `pg_status`, `entries`; an entry has
record_id, pg_id, process_group (name, desc), collective_seq_id, p2p_seq_id, is_p2p,
profiling_name ("nccl:all_reduce", "gloo:all_gather"), input/output sizes and dtypes, state
(scheduled, started, completed), retired, time_created_ns, time_discovered_started_ns and
_completed_ns (NCCL only), frames [{name, filename, line}] (pickle only).

Beside our own dumps, a bundle's flight_recorder/ holds each rank's Python stacks at the moment of
the dump (`rank{r}.stacks.json`) and its process groups by axis (`rank{r}.groups.json`), written by
probe/forensics.py.
"""

from __future__ import annotations

import io
import json
import pickle
import pickletools
import re
from dataclasses import dataclass, field
from pathlib import Path

from .model import TraceError

MAX_DUMP_BYTES = 1 << 30
_SAFE_OPS = frozenset({
    "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP", "NONE", "NEWTRUE", "NEWFALSE",
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
    "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8",
    "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8",
    "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST", "APPEND", "APPENDS",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_SET", "ADDITEMS", "FROZENSET",
    "GET", "BINGET", "LONG_BINGET", "PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE",
})


class DumpError(TraceError):
    """A Flight Recorder dump that cannot be read: one line, exit 2."""


class _NoClasses(pickle.Unpickler):
    def find_class(self, module, name):  # pragma: no cover - the opcode check refuses first
        raise pickle.UnpicklingError(f"refused: the dump names a class ({module}.{name})")


def safe_unpickle(data: bytes, path: Path) -> object:
    """The pickle's value if it holds only builtin containers and scalars; DumpError otherwise,
    without running anything from it."""
    try:
        for op, _, _ in pickletools.genops(data):
            if op.name not in _SAFE_OPS:
                raise DumpError(f"{path}: refused: the pickle uses {op.name}, which can run code; a Flight Recorder "
                                f"dump holds only dicts, lists, strings and numbers")
    except DumpError:
        raise
    except Exception as e:  # ValueError from genops: truncated or not a pickle
        raise DumpError(f"{path}: not a readable Flight Recorder dump (truncated or not a pickle: {e})") from None
    try:
        return _NoClasses(io.BytesIO(data)).load()
    except Exception as e:  # noqa: BLE001 - any failure of a checked pickle is one line
        raise DumpError(f"{path}: not a readable Flight Recorder dump ({e})") from None


@dataclass
class RankDump:
    """One rank's records (entries as dicts, seq ids as ints), and what else is known of it."""

    rank: int
    path: str
    version: str
    entries: list[dict]
    pg_config: dict
    pg_status: dict
    stacks: list[dict] = field(default_factory=list)  # [{thread, main, frames: [{file, line, name}]}]
    groups: dict = field(default_factory=dict)  # pg name -> {axis, ranks} (our own runs)
    job: str | None = None  # what tells jobs apart (pid of the process, command), where known
    records: bool = True  # False: the rank left stacks (it raised) but no Flight Recorder dump
    error: str | None = None  # the exception the rank failed with, where it wrote one


_RANK = re.compile(r"(\d+)(?:\.fr)?(?:\.pkl|\.json|\.pickle)?$")


def rank_of(name: str) -> int | None:
    """The rank a dump's file name gives: torch names them prefix + rank (`nccl_trace_rank_3`),
    ours rank{r}.fr.pkl."""
    m = _RANK.search(name)
    return int(m.group(1)) if m else None


def _as_int(v, default: int = -1) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def _normal(entry: dict) -> dict:
    e = dict(entry)
    for k in ("collective_seq_id", "p2p_seq_id", "pg_id", "record_id"):
        e[k] = _as_int(e.get(k))
    pg = e.get("process_group")
    e["pg_name"] = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else str(e.get("pg_id", ""))
    e["pg_desc"] = str(pg[1]) if isinstance(pg, (list, tuple)) and len(pg) > 1 else ""
    name = str(e.get("profiling_name") or "")
    e["op"] = name.split(":", 1)[1] if ":" in name else name
    for k in ("input_dtypes", "output_dtypes"):
        if isinstance(e.get(k), str):
            e[k] = [e[k]]
    return e


def load_dump(path: Path) -> RankDump:
    try:
        size = path.stat().st_size
        if size > MAX_DUMP_BYTES:
            raise DumpError(f"{path}: {size / 1e9:.1f} GB is not a Flight Recorder dump (limit {MAX_DUMP_BYTES >> 30} GB)")
        data = path.read_bytes()
    except OSError as e:
        raise DumpError(f"{path}: cannot read ({e.strerror})") from None
    if not data:
        raise DumpError(f"{path}: empty file")
    if data[:1] == b"\x80":
        doc = safe_unpickle(data, path)
    else:
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise NotADump(f"{path}: neither a Flight Recorder pickle nor its JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise NotADump(f"{path}: not a Flight Recorder dump (no entries list)")
    rank = rank_of(path.name)
    if rank is None:
        raise DumpError(f"{path}: no rank in the file name (torch names dumps prefix + rank, e.g. nccl_trace_rank_0)")
    entries = [_normal(e) for e in doc["entries"] if isinstance(e, dict)]
    return RankDump(rank, str(path), str(doc.get("version", "")), entries,
                    doc.get("pg_config") if isinstance(doc.get("pg_config"), dict) else {},
                    doc.get("pg_status") if isinstance(doc.get("pg_status"), dict) else {})


class NotADump(DumpError):
    """A file that holds no Flight Recorder records (not a pickle or JSON of an `entries` list)."""


_SIDE = re.compile(r"rank\d+\.(stacks|groups)\.json")  # our own side files beside the dumps


def might_be_dump(path: Path) -> bool:
    """Whether a file's first bytes are a pickle's (protocol 2+) or a JSON object's: a dump is found
    by what it holds, whatever prefix TORCH_FR_DUMP_TEMP_FILE gave it (torch names it prefix + rank)."""
    if _SIDE.fullmatch(path.name):
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return False
    return head[:1] == b"\x80" or head.lstrip()[:1] == b"{"


def load_dir(directory: Path) -> list[RankDump]:
    """Every rank's dump in a directory (ours, or a torch job's TORCH_FR_DUMP_TEMP_FILE files), with
    our side files (stacks, groups) where present."""
    try:
        names = sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))
    except OSError as e:
        raise DumpError(f"{directory}: cannot list ({e.strerror})") from None
    side = {p.name: p for p in names}
    dumps = []
    for p in names:
        if might_be_dump(p):
            try:
                dumps.append(load_dump(p))
            except NotADump:
                continue  # another file beside the dumps (a log, a config): not records
    by_rank: dict[int, RankDump] = {}
    for d in dumps:
        if d.rank in by_rank:
            raise DumpError(f"{directory}: two dumps of rank {d.rank} ({Path(by_rank[d.rank].path).name}, "
                            f"{Path(d.path).name}): dumps of two jobs mixed?")
        by_rank[d.rank] = d
    for r, d in by_rank.items():
        for key, attr in ((f"rank{r}.stacks.json", "stacks"), (f"rank{r}.groups.json", "groups")):
            if key in side:
                try:
                    doc = json.loads(side[key].read_text())
                    setattr(d, attr, doc.get(attr) or getattr(d, attr))
                    if attr == "stacks":
                        d.job = str(doc.get("job") or "") or None
                        d.error = doc.get("error")
                except (OSError, ValueError, AttributeError):
                    pass  # a side file cut short: the records still stand
    # ranks that died without a dump still have stacks (the exception handler) and groups
    for key, p in side.items():
        m = re.fullmatch(r"rank(\d+)\.stacks\.json", key)
        if m and int(m.group(1)) not in by_rank:
            try:
                doc = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            by_rank[int(m.group(1))] = RankDump(int(m.group(1)), str(p), "", [], {}, {}, doc.get("stacks") or [],
                                                records=False, error=doc.get("error"))
    return [by_rank[r] for r in sorted(by_rank)]
