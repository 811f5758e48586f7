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


_RANK = re.compile(r"(\d+)(?:\.fr)?(?:\.pkl|\.json|\.pickle)?$", re.ASCII)


def rank_of(name: str) -> int | None:
    """The rank a dump's file name gives: torch names them prefix + rank (`nccl_trace_rank_3`),
    ours rank{r}.fr.pkl."""
    m = _RANK.search(name)
    return int(m.group(1)) if m else None


MAX_ENTRIES = 1 << 20  # torch's ring buffer holds TORCH_FR_BUFFER_SIZE entries (2,000 by default)
MAX_GROUPS = 1 << 17
MAX_FRAMES = 512
MAX_TEXT = 4096
_NS = (0, (1 << 63) - 1)  # a time in ns: what fits int64


def _as_int(v, default: int = -1, lo: int = -(1 << 62), hi: int = 1 << 62) -> int:
    """An integer within [lo, hi] (a bool, a float that is not finite, text or a number beyond the
    range gives `default`): the checked boundary for every number of a dump."""
    if isinstance(v, bool):
        return default
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return default
        v = int(v)
    elif isinstance(v, str) and len(v) <= 20:
        try:
            v = int(v)
        except ValueError:
            return default
    return v if isinstance(v, int) and lo <= v <= hi else default


def _text(v, default: str = "") -> str:
    return v[:MAX_TEXT] if isinstance(v, str) else default


def _time(v) -> int | None:
    t = _as_int(v, -1, *_NS)
    return t if t >= 0 else None


def _frames(v) -> list[dict]:
    """Frames as {name, filename, line} of the right types; anything else dropped."""
    out = []
    for f in v[:MAX_FRAMES] if isinstance(v, list) else []:
        if isinstance(f, dict):
            out.append({"name": _text(f.get("name")), "filename": _text(f.get("filename") or f.get("file")),
                        "line": _as_int(f.get("line", f.get("lineno")), 0, 0, 1 << 31)})
    return out


def _sizes(v) -> list:
    return [[_as_int(x, -1, 0, 1 << 62) for x in s[:16]] if isinstance(s, list) else [] for s in v[:64]] \
        if isinstance(v, list) else []


def _normal(entry: dict) -> dict:
    """One entry with every field the diagnosis reads, each of its expected type (a field of the
    wrong type reads as absent): the dump's checked boundary."""
    pg = entry.get("process_group")
    name = _text(entry.get("profiling_name"))
    e = {k: _as_int(entry.get(k)) for k in ("collective_seq_id", "p2p_seq_id", "pg_id", "record_id", "op_id")}
    e.update(pg_name=_text(pg[0]) if isinstance(pg, (list, tuple)) and pg and isinstance(pg[0], str)
             else str(e["pg_id"]),
             pg_desc=_text(pg[1]) if isinstance(pg, (list, tuple)) and len(pg) > 1 else "",
             profiling_name=name, op=name.split(":", 1)[1] if ":" in name else name,
             state=_text(entry.get("state")), retired=entry.get("retired") is True, is_p2p=entry.get("is_p2p") is True,
             frames=_frames(entry.get("frames")), input_sizes=_sizes(entry.get("input_sizes")),
             output_sizes=_sizes(entry.get("output_sizes")),
             time_created_ns=_time(entry.get("time_created_ns")),
             time_discovered_started_ns=_time(entry.get("time_discovered_started_ns")),
             time_discovered_completed_ns=_time(entry.get("time_discovered_completed_ns")),
             timeout_ms=_as_int(entry.get("timeout_ms")))
    for k in ("input_dtypes", "output_dtypes"):
        v = entry.get(k)
        e[k] = [v[:64]] if isinstance(v, str) else [_text(x) for x in v[:64]] if isinstance(v, list) else []
    return e


def _groups(v) -> dict:
    """pg_config as {name: {name, desc, ranks}} of the right types, at most MAX_GROUPS."""
    if not isinstance(v, dict):
        return {}
    if len(v) > MAX_GROUPS:
        raise DumpError(f"{len(v)} process groups in one dump (limit {MAX_GROUPS})")
    out = {}
    for k, g in v.items():
        if isinstance(g, dict):
            ranks = g.get("ranks")
            out[str(k)[:MAX_TEXT]] = {"name": _text(g.get("name"), str(k)[:MAX_TEXT]), "desc": _text(g.get("desc")),
                                      "ranks": ranks[:1 << 20] if isinstance(ranks, str)
                                      else [r for r in ranks[:1 << 20] if _as_int(r, -1, 0, 1 << 31) >= 0]
                                      if isinstance(ranks, list) else []}
    return out


def stacks_of(doc) -> list[dict]:
    """A side file's stacks as [{thread, main, frames}] of the right types."""
    out = []
    for st in doc[:4096] if isinstance(doc, list) else []:
        if isinstance(st, dict):
            out.append({"thread": _text(st.get("thread")), "main": st.get("main") is True,
                        "frames": [{"file": f["filename"], "line": f["line"], "name": f["name"]}
                                   for f in _frames(st.get("frames"))]})
    return out


def groups_of(doc) -> dict:
    """A side file's groups as {pg: {axis, ranks}} of the right types."""
    out = {}
    for k, g in (doc.items() if isinstance(doc, dict) else ()):
        if isinstance(g, dict) and isinstance(g.get("ranks"), list):
            out[str(k)[:MAX_TEXT]] = {"axis": g["axis"] if isinstance(g.get("axis"), str) else None,
                                      "ranks": [r for r in g["ranks"] if _as_int(r, -1, 0, 1 << 31) >= 0]}
    return out


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
        except RecursionError:
            raise DumpError(f"{path}: JSON nested too deeply for a Flight Recorder dump") from None
        except ValueError as e:  # invalid JSON, or an integer of thousands of digits
            raise NotADump(f"{path}: neither a Flight Recorder pickle nor its JSON ({str(e)[:120]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise NotADump(f"{path}: not a Flight Recorder dump (no entries list)")
    rank = rank_of(path.name)
    if rank is None:
        raise DumpError(f"{path}: no rank in the file name (torch names dumps prefix + rank, e.g. nccl_trace_rank_0)")
    return dump_of(doc, rank, str(path))


def dump_of(doc, rank: int, source: str) -> RankDump:
    """One rank's parsed records (a dump file's, or what a live rank's worker server answered to
    `fr_trace_json`), checked: DumpError in one line naming `source`."""
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise NotADump(f"{source}: not a Flight Recorder dump (no entries list)")
    if len(doc["entries"]) > MAX_ENTRIES:
        raise DumpError(f"{source}: {len(doc['entries'])} entries (limit {MAX_ENTRIES}): not a Flight Recorder ring buffer")
    entries = [_normal(e) for e in doc["entries"] if isinstance(e, dict)]
    try:
        groups = _groups(doc.get("pg_config"))
    except DumpError as e:
        raise DumpError(f"{source}: {e}") from None
    return RankDump(rank, source, _text(doc.get("version"))[:40], entries, groups,
                    doc.get("pg_status") if isinstance(doc.get("pg_status"), dict) else {})


def _side(p: Path) -> dict | None:
    """One of our side files (rankN.stacks.json, rankN.groups.json) as a dict, or None where it is
    cut short, too deep, too large or not an object."""
    try:
        if p.stat().st_size > MAX_DUMP_BYTES:
            return None
        doc = json.loads(p.read_text(errors="replace"))
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


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
                doc = _side(side[key])
                if not doc:
                    continue  # a side file cut short or of the wrong shape: the records still stand
                setattr(d, attr, (stacks_of if attr == "stacks" else groups_of)(doc.get(attr)) or getattr(d, attr))
                if attr == "stacks":
                    d.job = _text(doc.get("job")) or None
                    d.error = _text(doc.get("error")) or None
    # ranks that died without a dump still have stacks (the exception handler) and groups
    for key, p in side.items():
        m = re.fullmatch(r"rank(\d+)\.stacks\.json", key)
        if m and len(m.group(1)) < 10 and int(m.group(1)) not in by_rank:
            doc = _side(p)
            if not doc:
                continue
            by_rank[int(m.group(1))] = RankDump(int(m.group(1)), str(p), "", [], {}, {}, stacks_of(doc.get("stacks")),
                                                records=False, error=_text(doc.get("error")) or None)
    return [by_rank[r] for r in sorted(by_rank)]
