"""NCCL's own record of who sends how much to whom, as an Nsight Systems export keeps it: the
payloads of NCCL's NVTX ranges (NVIDIA/nccl src/include/nvtx_payload_schemas.h).

NCCL attaches a typed payload to each API range: ncclSend and ncclRecv carry {"NCCL communicator
ID", "Message size [bytes]", "Peer rank"} (older NCCL: {"Bytes", "Peer rank"}, no communicator),
ncclCommInitRank {"NCCL communicator ID", "No. of ranks", "Rank", "CUDA device"}. An all-to-all
(torch's all_to_all_single on NCCL) is one ncclGroupStart .. ncclGroupEnd holding a send and a receive
per peer (torch leaves out a peer whose count is 0), its kernel launched inside ncclGroupEnd; NCCL
2.28's one-call ncclAlltoAll (RCCL: ncclAllToAll) carries {communicator, "Message size [bytes]"}, the
bytes per peer: an even split.

In the SQLite export the schemas are tables (NVTX_PAYLOAD_SCHEMAS: payloadSize per (domainId,
schemaId); NVTX_PAYLOAD_SCHEMA_ENTRIES: name, type and offset of each field, the first field's
offset NULL) and each range's values a blob (NVTX_EVENTS.binaryData): a 32-byte header of
little-endian u64s (domain id, schema id, payload size, then one that nsys-ai's two readers take for
the total size and for the payload's offset, 32: not read here) and the payload's bytes from byte
32. `nsys export` writes the blobs only when asked (`--include-blobs=true`; 2026.2's default is
false, EXPORT_PARAM_INCLUDE_BLOBS in META_DATA_EXPORT): the real FastVideo exports in
tests/data/traces/nsys-ai-fastvideo hold the schema tables and every NCCL range but no blob, and
what cannot be told is then said with the command that would tell it (`missing_reason`).
Field types and widths are NVTX's (nvToolsExtPayload.h, NVTX_PAYLOAD_ENTRY_TYPE_*; LP64).
The header's layout is as nsys-ai (GindaChen/nsys-ai, MIT) documents it from real 2026 exports;
no export with blobs is public, so the decoder is tested on a real export whose blobs were filled
in that layout (tests/test_nvtx_payloads.py), and checked again on the first real one met.
"""

from __future__ import annotations

import sqlite3
import struct
from dataclasses import dataclass, field

# NVTX_PAYLOAD_ENTRY_TYPE_* -> (bytes, signed), for the types an integer field can have
_TYPES = {1: (1, True), 2: (1, False), 3: (2, True), 4: (2, False), 5: (4, True), 6: (4, False), 7: (8, True),
          8: (8, False), 9: (8, True), 10: (8, False), 11: (1, True), 12: (1, False), 13: (2, True), 14: (2, False),
          15: (4, True), 16: (4, False), 17: (8, True), 18: (8, False), 22: (8, False), 23: (8, False)}
HEADER = 32
MAX_BLOB = 1 << 16  # an NCCL payload is a few dozen bytes: a larger blob is not one
MAX_PEERS = 4096  # as per_rank/traffic.MAX_GROUP
MAX_BYTES = 1 << 50  # one message of a petabyte is not one: the matrices sum calls in int64
BYTES_KEYS = ("Message size [bytes]", "Bytes")
ALLTOALL_NAMES = ("ncclAlltoAll", "ncclAllToAll")  # NCCL 2.28's one-call all-to-all; RCCL spells it so
GROUP_NAMES = ("ncclGroupStart", "ncclGroupEnd", "ncclSend", "ncclRecv", *ALLTOALL_NAMES)
INIT_PREFIX = "ncclCommInitRank"


def schemas(db: sqlite3.Connection, tables: set[str]) -> dict[tuple[int, int], tuple[int, list]]:
    """(domain id, schema id) -> (payload size, [(field name, offset, bytes, signed)]); {} where the
    export has no schema tables. Rows repeat per process in real exports: each (domain, schema,
    index) is taken once."""
    if not {"NVTX_PAYLOAD_SCHEMAS", "NVTX_PAYLOAD_SCHEMA_ENTRIES"} <= tables:
        return {}
    sizes = {(d, s): n for d, s, n in db.execute("SELECT domainId, schemaId, payloadSize FROM NVTX_PAYLOAD_SCHEMAS")
             if all(type(v) is int for v in (d, s, n)) and 0 < n <= MAX_BLOB}
    fields: dict[tuple[int, int], dict[int, tuple]] = {}
    for d, s, idx, typ, name, off in db.execute(
            'SELECT domainId, schemaId, idx, "type", name, "offset" FROM NVTX_PAYLOAD_SCHEMA_ENTRIES'):
        if (d, s) in sizes and type(idx) is int and typ in _TYPES and isinstance(name, str):
            off = off if type(off) is int else 0
            if off < 0:
                continue
            fields.setdefault((d, s), {}).setdefault(idx, (name, off, *_TYPES[typ]))
    return {k: (sizes[k], [f[i] for i in sorted(f)]) for k, f in fields.items()}


def decode(blob: object, known: dict[tuple[int, int], tuple[int, list]]) -> dict[str, int] | None:
    """One range's payload as {field name: integer}, or None (no blob, an unknown schema, too short)."""
    if not isinstance(blob, bytes) or not HEADER <= len(blob) <= MAX_BLOB:
        return None
    domain, schema, size = struct.unpack_from("<QQQ", blob)
    found = known.get((domain, schema))
    if found is None:
        found = next((v for (d, s), v in known.items() if s == schema), None)
    if found is None or size < found[0] or len(blob) < HEADER + found[0]:
        return None
    out = {}
    for name, off, width, signed in found[1]:
        if off + width <= found[0]:
            out[name] = int.from_bytes(blob[HEADER + off:HEADER + off + width], "little", signed=signed)
    return out


@dataclass
class Group:
    """One ncclGroupStart .. ncclGroupEnd on a thread: what it sent to and received from each peer
    (communicator ranks), where its payloads say; times in ns."""

    tid: int
    start: int
    end_start: int  # ncclGroupEnd's start and end: the kernel launch happens inside it
    end: int
    comm: int | None = None
    send: dict[int, int] = field(default_factory=dict)
    recv: dict[int, int] = field(default_factory=dict)
    ops: int = 0  # ncclSend/ncclRecv ranges in it, decoded or not
    uniform: int | None = None  # an ncclAlltoAll: the bytes it sends every peer (and receives from each)


def groups(rows: list[tuple], known: dict) -> list[Group]:
    """The grouped sends and receives of (start, end, tid, name, blob) rows in (tid, start) order.
    Nested groups are one (NCCL launches at the outermost ncclGroupEnd); a send outside a group is
    a single p2p op, not an all-to-all, and is not kept. An ncclAlltoAll outside a group is a group of
    its own, its kernel launched inside its range; its payload's size is per peer (count x type size).
    Any other NCCL call outside a group whose payload names its communicator (ncclAllReduce, ...)
    is a group of its own with no sizes: it names the communicator of the kernel it launches; inside a
    group, it names the group's."""
    out: list[Group] = []
    depth: dict[int, int] = {}
    cur: dict[int, Group] = {}
    for start, end, tid, name, blob in rows:
        if name in ALLTOALL_NAMES and tid not in cur:
            p = decode(blob, known) or {}
            size = next((p[k] for k in BYTES_KEYS if k in p), None)
            if size is not None and 0 <= size <= MAX_BYTES:
                out.append(Group(tid, start, start, end, p.get("NCCL communicator ID"), ops=1, uniform=size))
        elif isinstance(name, str) and name.startswith("nccl") and name not in GROUP_NAMES and blob is not None:
            comm = (decode(blob, known) or {}).get("NCCL communicator ID")
            if comm is None:
                continue
            if tid in cur:
                cur[tid].comm = comm if cur[tid].comm is None else cur[tid].comm
            else:
                out.append(Group(tid, start, start, end, comm))
        elif name == "ncclGroupStart":
            if depth.get(tid, 0) == 0:
                cur[tid] = Group(tid, start, end, end)
            depth[tid] = depth.get(tid, 0) + 1
        elif name == "ncclGroupEnd" and depth.get(tid, 0) > 0:
            depth[tid] -= 1
            if depth[tid] == 0:
                g = cur.pop(tid)
                g.end_start, g.end = start, end
                out.append(g)
        elif name in ("ncclSend", "ncclRecv") and tid in cur:
            g = cur[tid]
            g.ops += 1
            p = decode(blob, known)
            size = next((p[k] for k in BYTES_KEYS if p and k in p), None)
            peer = (p or {}).get("Peer rank")
            if size is None or peer is None or not 0 <= peer < MAX_PEERS or not 0 <= size <= MAX_BYTES:
                continue
            side = g.send if name == "ncclSend" else g.recv
            side[peer] = side.get(peer, 0) + size
            g.comm = (p or {}).get("NCCL communicator ID", g.comm)
    return out


def comm_ranks(rows: list[tuple], known: dict) -> dict[int | None, tuple[int, int]]:
    """Communicator id -> (this process's rank in it, its size), from ncclCommInitRank* payloads
    (rows: (name, blob)); the key None holds the largest communicator's (the world's, as a rank
    source): only where this process holds one rank of it."""
    found: dict[int | None, set[tuple[int, int]]] = {}
    for name, blob in rows:
        if not (isinstance(name, str) and name.startswith(INIT_PREFIX)):
            continue
        p = decode(blob, known) or {}
        rank, n = p.get("Rank"), p.get("No. of ranks")
        if isinstance(rank, int) and isinstance(n, int) and 0 <= rank < n <= 1 << 24:
            found.setdefault(p.get("NCCL communicator ID"), set()).add((rank, n))
    out = {c: next(iter(v)) for c, v in found.items() if len(v) == 1}
    if found:
        n = max(n for v in found.values() for _, n in v)
        world = {r for v in found.values() for r, m in v if m == n}
        if len(world) == 1:
            out[None] = (world.pop(), n)
    return out


def splits(gs: list[Group], ranks: dict) -> list[tuple[Group, dict]]:
    """Each group with decoded sizes as the args per_rank/traffic.py reads ("nccl_peer_send_bytes",
    "nccl_peer_recv_bytes": a list per communicator rank; "nccl_comm_rank" where known): its width
    the communicator's size from its init payload, else the highest peer any of this rank's groups
    of that communicator names, plus one."""
    width: dict[int | None, int] = {}
    for g in gs:
        if g.send or g.recv:
            width[g.comm] = max(width.get(g.comm, 0), 1 + max((*g.send, *g.recv)))
    out = []
    for g in gs:
        if g.uniform is not None:  # every peer the same bytes: a matrix where the communicator's size is known
            if g.comm is not None and g.comm in ranks:
                n = ranks[g.comm][1]
                out.append((g, {"nccl_peer_send_bytes": [g.uniform] * n, "nccl_peer_recv_bytes": [g.uniform] * n,
                                "nccl_comm_rank": ranks[g.comm][0]}))
            else:
                out.append((g, {"nccl_uniform_bytes": g.uniform}))
            continue
        if not (g.send or g.recv):
            continue
        n = ranks[g.comm][1] if g.comm in ranks and g.comm is not None else width[g.comm]
        if max((*g.send, *g.recv)) >= n:
            continue
        args = {"nccl_peer_send_bytes": [g.send.get(p, 0) for p in range(n)],
                "nccl_peer_recv_bytes": [g.recv.get(p, 0) for p in range(n)]}
        if g.comm is not None and g.comm in ranks:
            args["nccl_comm_rank"] = ranks[g.comm][0]
        out.append((g, args))
    return out


def export_flag(db: sqlite3.Connection, tables: set[str]) -> str | None:
    """The export's EXPORT_PARAM_INCLUDE_BLOBS ("true", "false"), None where it does not say (older nsys)."""
    if "META_DATA_EXPORT" not in tables:
        return None
    row = db.execute("SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_PARAM_INCLUDE_BLOBS'").fetchone()
    return row[0] if row and isinstance(row[0], str) else None


def missing_reason(flag: str | None, blob_column: bool, sends: int, decoded: int, nccl_ranges: bool) -> str | None:
    """Why an export's all-to-alls carry no sizes, in the words that would mend it; None where it
    has them. `flag`: its EXPORT_PARAM_INCLUDE_BLOBS (export_flag); `blob_column`: whether
    NVTX_EVENTS has binaryData; `nccl_ranges`: whether NCCL's own API ranges are in it at all."""
    if decoded:
        return None
    if not sends and nccl_ranges:
        return ("NCCL's NVTX ranges here record no all-to-all sizes: its all-to-all is run neither as grouped "
                "ncclSend/ncclRecv nor as ncclAlltoAll, whose payloads carry them")
    if not sends:
        return ("the Nsight export holds no NCCL NVTX ranges, whose ncclSend/ncclRecv (or ncclAlltoAll) payloads carry "
                "the sizes: profile with `nsys profile --trace=cuda,nvtx` (NCCL records NVTX by default)")
    if not blob_column or flag == "false":
        return (f"the Nsight export left out the payloads of NCCL's {sends} ncclSend/ncclRecv/ncclAlltoAll NVTX "
                "ranges, which hold the sizes" + (" (EXPORT_PARAM_INCLUDE_BLOBS false)" if flag == "false" else "")
                + ": export the report again with `nsys export --type sqlite --include-blobs=true`")
    return (f"none of NCCL's {sends} ncclSend/ncclRecv/ncclAlltoAll NVTX ranges carries a payload this version reads "
            "(an NCCL without payload schemas, or a schema of other field names)")
