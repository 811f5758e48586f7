"""NCCL's NVTX payloads in Nsight exports (issue 61: who sends how much to whom, from Nsight): the
real FastVideo exports (tests/data/traces/nsys-ai-fastvideo, Nsight 2026.2, a Ulysses
sequence-parallel all-to-all over 2 H100s) read as CP all-to-all and say, with the command that
would mend it, that their export left the payloads out; the same real exports with their blobs
filled in the layout real exports use give the matrix written, exactly, and the ranks NCCL gave."""

from __future__ import annotations

import json
import shutil
import sqlite3
import struct

import pytest

from commprobe.analyzers.analysis import analyze
from commprobe.analyzers.readers import nvtx_payloads
from tests.conftest import ROOT, run_cli
from tests.test_nsys import _sql  # read-only SQL on a real export: the tests' own truth

FASTVIDEO = ROOT / "tests" / "data" / "traces" / "nsys-ai-fastvideo"
BEFORE = FASTVIDEO / "mfu_2gpu_before.sqlite"
needs_real = pytest.mark.usefixtures("real_traces")
MIB = 1 << 20


@needs_real
def test_the_real_exports_are_cp_all_to_all_whose_sizes_the_export_left_out():
    """Truth from the raw tables: each process runs its all-to-alls as ncclGroupStart, (ncclSend,
    ncclRecv) x 2 peers, ncclGroupEnd; the export's own metadata says blobs were not included and no
    row has one. The analysis calls them CP (attention between them, no experts), counts them, and
    says what cannot be told and the export command that would tell it."""
    pids = [p for (p,) in _sql(BEFORE, "SELECT DISTINCT (globalPid >> 24) & 16777215 FROM CUPTI_ACTIVITY_KIND_KERNEL")]
    assert sorted(pids) == [144, 145]
    assert _sql(BEFORE, "SELECT count(binaryData), count(jsonText) FROM NVTX_EVENTS") == [(0, 0)]
    assert _sql(BEFORE, "SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_PARAM_INCLUDE_BLOBS'") == [("false",)]
    for pid, groups in ((144, 32), (145, 34)):  # the window cut the capture: 2 of 145's groups launch after it
        names = [n for (n,) in _sql(BEFORE, "SELECT coalesce(n.text, s.value) FROM NVTX_EVENTS n LEFT JOIN StringIds s "
                                            "ON s.id = n.textId WHERE ((n.globalTid >> 24) & 16777215) = ? AND "
                                            "coalesce(n.text, s.value) IN ('ncclGroupStart', 'ncclGroupEnd', 'ncclSend', "
                                            "'ncclRecv') ORDER BY n.start", pid)]
        assert names == ["ncclGroupStart", "ncclSend", "ncclRecv", "ncclSend", "ncclRecv", "ncclGroupEnd"] * groups
    # 33 SendRecv kernels per device: the first launched before the window (an unknown op: no launch), then
    # one per group, in order (its launch is the cuLaunchKernelEx inside its ncclGroupEnd)
    kernels = _sql(BEFORE, "SELECT k.deviceId, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON "
                           "s.id = k.demangledName WHERE s.value LIKE 'ncclDevKernel_SendRecv%' GROUP BY 1")
    assert kernels == [(0, 33), (1, 33)]
    t = analyze(BEFORE)["phases"]["trace"]["all_to_all"]
    assert (t["axis"], t["calls"], t["unsized_calls"], t["sizes"], t["finding"]) == ("cp", 32, 32, "not recorded", None)
    assert "nsys export --type sqlite --include-blobs=true" in t["note"]
    assert "EXPORT_PARAM_INCLUDE_BLOBS false" in t["note"]
    r = run_cli("analyze", str(BEFORE))
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "all-to-all" in x and "trace:" in x)
    assert line.startswith("CP all-to-all (sequence-parallel attention), trace:") and "EP" not in line


def _fill(src, dst, rank_of: dict[int, int], comm_of: dict[int, int] | None = None, init: bool = True):
    """A copy of the real export with what `nsys export --include-blobs=true` would have added: each
    ncclSend/ncclRecv range's payload blob (32-byte header, then comm id, bytes, peer: the export's
    own schema for it) and one ncclCommInitRank range per process giving it the rank `rank_of[pid]`,
    all on one communicator (or each process on its own, `comm_of[pid]`, a communicator of 2 still).
    Returns per pid the bytes written for each group, in order: (sent to peer 0, 1), (received from 0, 1)."""
    shutil.copy(src, dst)
    db = sqlite3.connect(dst)
    schemas = {}
    for sid, names in ((16777218, ("NCCL communicator ID", "No. of ranks", "Rank", "CUDA device")),
                       (16777225, ("NCCL communicator ID", "Message size [bytes]", "Peer rank")),
                       (16777226, ("NCCL communicator ID", "Message size [bytes]", "Peer rank"))):
        got = tuple(n for (n,) in db.execute("SELECT DISTINCT name FROM NVTX_PAYLOAD_SCHEMA_ENTRIES WHERE schemaId = ? "
                                             "ORDER BY idx", (sid,)))
        assert got == names  # the real export's own schemas (asserted, not assumed)
        schemas[sid] = db.execute("SELECT DISTINCT payloadSize FROM NVTX_PAYLOAD_SCHEMAS WHERE schemaId = ?",
                                  (sid,)).fetchone()[0]
    comm = 0x5EED_C0FFEE

    def blob(sid, payload):
        return struct.pack("<QQQQ", 1, sid, schemas[sid], 32) + payload.ljust(schemas[sid], b"\0")

    written = {}
    for pid, rank in rank_of.items():
        own = (comm_of or {}).get(pid, comm)
        rows = db.execute("SELECT n.rowid, coalesce(n.text, s.value), n.start, n.globalTid FROM NVTX_EVENTS n "
                          "LEFT JOIN StringIds s ON s.id = n.textId WHERE ((n.globalTid >> 24) & 16777215) = ? AND "
                          "coalesce(n.text, s.value) IN ('ncclGroupStart', 'ncclSend', 'ncclRecv') ORDER BY n.start",
                          (pid,)).fetchall()
        out, n, seen = [], -1, []
        for rowid, name, _, _ in rows:
            if name == "ncclGroupStart":
                n, seen = n + 1, []
                # call n: rank r sends (r + 1) MiB + n KiB to group rank 0 and 3 (r + 1) MiB + n KiB to group rank 1
                out.append(([(rank + 1) * MIB + n * 1024, 3 * (rank + 1) * MIB + n * 1024],
                            [(s + 1) * (1 + 2 * rank) * MIB + n * 1024 for s in (0, 1)]))
                continue
            peer = sum(1 for x in seen if x == name)
            seen.append(name)
            size = out[-1][0 if name == "ncclSend" else 1][peer]
            db.execute("UPDATE NVTX_EVENTS SET binaryData = ? WHERE rowid = ?",
                       (blob(16777226 if name == "ncclSend" else 16777225, struct.pack("<QQi", own, size, peer)), rowid))
        if init:
            _init_range(db, rows[0], blob(16777218, struct.pack("<Qiii", own, 2, rank, 0)))
        written[pid] = out
    return _blobs_exported(db, written)


def _init_range(db, first: tuple, blob: bytes) -> None:
    """An ncclCommInitRank range with `blob`, just before the process's first NCCL range `first`
    (rowid, name, start, globalTid), on its thread."""
    db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId, binaryData) "
               "VALUES (?, ?, 59, 'ncclCommInitRank', ?, 1, ?)", (first[2] - 2000, first[2] - 1000, first[3], blob))


def _blobs_exported(db, written):
    """The copy's metadata says what `nsys export --include-blobs=true` would say; the copy closed."""
    db.execute("UPDATE META_DATA_EXPORT SET value = 'true' WHERE name = 'EXPORT_PARAM_INCLUDE_BLOBS'")
    db.commit()
    db.close()
    return written


@needs_real
def test_payload_blobs_give_the_matrix_written_and_nccls_ranks(tmp_path):
    """The ranks are NCCL's (swapped against the devices on purpose: pid 144 drives device 0 and is
    rank 1), and the matrix is the sum of what each call's payloads say, computed here from what was
    written: call n sends 1 MiB + n KiB and 3 MiB + n KiB from rank 0, 2 and 6 MiB (+ n KiB) from
    rank 1. Process 145's last two groups launched their kernels after the window: left out."""
    p = tmp_path / "fastvideo_blobs.sqlite"
    written = _fill(BEFORE, p, {144: 1, 145: 0})
    a = analyze(p)
    assert [(r["rank"], r["identity"]["pid"]) for r in a["ranks"]] == [(0, 145), (1, 144)]
    assert a["source"]["rank_rule"] == "the trace's own rank"
    t = a["phases"]["trace"]["all_to_all"]
    calls = 32  # groups 0..31 of each process: their kernels are in the window
    sent = {1: written[144][:calls], 0: written[145][:calls]}  # rank -> its groups' (send, recv)
    truth = [[sum(call[0][d] for call in sent[s]) for d in (0, 1)] for s in (0, 1)]
    assert (t["axis"], t["sizes"], t["sized_calls"], t["unsized_calls"]) == ("cp", "recorded", calls, 0)
    assert t["matrix"] == truth and t["consistent"] is True and t["ranks"] == [0, 1]
    received = [truth[0][d] + truth[1][d] for d in (0, 1)]
    assert t["received"] == received and t["hot_rank"] == 1
    assert t["imbalance"] == pytest.approx(received[1] / (sum(received) / 2), rel=1e-12)
    assert t["skew"].startswith("rank 1 receives 1.50x the mean of the CP all-to-all")
    # without the sizes' skew being the cause of the waiting, no finding; its words never speak of experts
    words = (t.get("finding") or "") + (t.get("note") or "")
    assert "expert" not in words and "routing" not in words and "the uneven split is not what holds" in words


def test_the_decoder_on_its_edges():
    """What real exports vary: the schema's first offset NULL (0), a header naming another domain, a
    blob too short for its schema, a group nested in a group, a send outside any group."""
    known = {(1, 7): (24, [("NCCL communicator ID", 0, 8, False), ("Message size [bytes]", 8, 8, False),
                           ("Peer rank", 16, 4, True)])}
    payload = struct.pack("<QQi", 9, 4096, 1) + b"\0" * 4
    blob = struct.pack("<QQQQ", 1, 7, 24, 32) + payload
    assert nvtx_payloads.decode(blob, known) == {"NCCL communicator ID": 9, "Message size [bytes]": 4096, "Peer rank": 1}
    assert nvtx_payloads.decode(struct.pack("<QQQQ", 3, 7, 24, 32) + payload, known)["Peer rank"] == 1
    assert nvtx_payloads.decode(blob[:40], known) is None and nvtx_payloads.decode(None, known) is None
    assert nvtx_payloads.decode(struct.pack("<QQQQ", 1, 8, 24, 32) + payload, known) is None
    rows = [(0, 1, 5, "ncclSend", blob), (2, 3, 5, "ncclGroupStart", None), (4, 5, 5, "ncclGroupStart", None),
            (6, 7, 5, "ncclSend", blob), (8, 9, 5, "ncclGroupEnd", None), (10, 11, 5, "ncclRecv", blob),
            (12, 20, 5, "ncclGroupEnd", None)]
    (g,) = nvtx_payloads.groups(rows, known)
    assert (g.start, g.end_start, g.end, g.send, g.recv, g.comm, g.ops) == (2, 12, 20, {1: 4096}, {1: 4096}, 9, 2)
    ((_, args),) = nvtx_payloads.splits([g], {})
    assert args == {"nccl_peer_send_bytes": [0, 4096], "nccl_peer_recv_bytes": [0, 4096]}


@needs_real
@pytest.mark.parametrize("name, waits, last", [("before", (11396, 2452), (11, 22)), ("after", (4511, 18275), (15, 16))])
def test_the_real_exports_waits_are_the_kernels_own(name, waits, last):
    """The matched all-to-alls' waiting per rank against a truth from the raw kernel rows: the n-th
    SendRecv kernel of each device is one call (the first too: launched before the window, it is
    matched as an unknown op); the last arriver (starts within 1 µs are one arrival: of them, the one
    that left first) sets the transfer, and each rank waits its time in the call beyond it."""
    path = FASTVIDEO / f"mfu_2gpu_{name}.sqlite"
    k = {d: _sql(path, "SELECT k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = "
                       "k.demangledName WHERE s.value LIKE 'ncclDevKernel_SendRecv%' AND deviceId = ? ORDER BY k.start", d)
         for d in (0, 1)}
    wait, times_last = [0, 0], [0, 0]
    for calls in zip(k[0], k[1]):
        start, dur = [c[0] for c in calls], [c[1] - c[0] for c in calls]
        tied = [r for r in (0, 1) if start[r] >= max(start) - 1000]
        lr = min(tied, key=lambda r: start[r] + dur[r])
        times_last[lr] += 1
        for r in (0, 1):
            wait[r] += max(0, dur[r] - dur[lr])
    assert [round(w / 1000) for w in wait] == list(waits) and tuple(times_last) == last
    rows = {r["rank"]: r for r in analyze(path)["collectives"]["ranks"]}
    assert [rows[r]["wait_us"] for r in (0, 1)] == pytest.approx([w / 1000 for w in wait], abs=1e-6)
    assert [rows[r]["times_last"] for r in (0, 1)] == list(times_last)


@needs_real
def test_the_perfetto_export_of_a_multi_process_export_has_every_rank_and_each_calls_imbalance(tmp_path):
    """An export holding both processes: the merged trace has both ranks (their parts are named
    FILE#pid=P,device=D; they were once none) with each device's 33 SendRecv kernels, and the counter
    track has each sized call's busiest receiver over the mean, computed here from what was written."""
    p = tmp_path / "fastvideo_blobs.sqlite"
    written = _fill(BEFORE, p, {144: 1, 145: 0})
    out = tmp_path / "merged.json"
    r = run_cli("analyze", str(p), "--perfetto", str(out))
    assert r.returncode == 0, r.stderr
    ev = json.loads(out.read_text())["traceEvents"]
    kernels = [e["pid"] for e in ev if e.get("ph") == "X" and e["name"].startswith("ncclDevKernel_SendRecv")]
    assert sorted(kernels) == [0] * 33 + [1] * 33
    counter = [e["args"]["imbalance"] for e in ev if e.get("ph") == "C" and "imbalance" in e["name"]]
    assert all(e["name"].startswith("CP all-to-all") for e in ev if e.get("ph") == "C" and "imbalance" in e["name"])
    truth = []
    for n in range(32):  # rank 0 is process 145, rank 1 process 144
        got = [written[145][n][0][d] + written[144][n][0][d] for d in (0, 1)]
        truth.append(round(max(got) / (sum(got) / 2), 4))
    assert counter == truth


@needs_real
@pytest.mark.parametrize("damage", ["text", "short", "huge-size", "huge-payload-size", "negative-schema", "int-names"])
def test_damaged_payloads_are_no_size_never_a_traceback(tmp_path, damage):
    """Blobs and schema rows a hostile or damaged export can hold: the calls they touch carry no size
    (the analysis runs, exit 0, and says what it could not tell), never a traceback."""
    p = tmp_path / "damaged.sqlite"
    _fill(BEFORE, p, {144: 1, 145: 0})
    db = sqlite3.connect(p)
    blob = "binaryData IS NOT NULL"
    if damage == "text":
        db.execute(f"UPDATE NVTX_EVENTS SET binaryData = 'not a blob' WHERE {blob}")
    elif damage == "short":
        db.execute(f"UPDATE NVTX_EVENTS SET binaryData = substr(binaryData, 1, 35) WHERE {blob}")
    elif damage == "huge-size":  # a message of 2^63 - 1 bytes
        db.execute(f"UPDATE NVTX_EVENTS SET binaryData = substr(binaryData, 1, 40) || x'ffffffffffffff7f' || "
                   f"substr(binaryData, 49) WHERE {blob}")
    elif damage == "huge-payload-size":
        db.execute(f"UPDATE NVTX_EVENTS SET binaryData = substr(binaryData, 1, 16) || x'ffffffffffffffff' || "
                   f"substr(binaryData, 25) WHERE {blob}")
    elif damage == "negative-schema":
        db.execute("UPDATE NVTX_PAYLOAD_SCHEMAS SET payloadSize = -8")
        db.execute('UPDATE NVTX_PAYLOAD_SCHEMA_ENTRIES SET "offset" = -40')
    else:
        db.execute("UPDATE StringIds SET value = 12345 WHERE value IN ('ncclSend', 'ncclGroupStart', 'nccl:all_to_all')")
        db.execute("UPDATE NVTX_EVENTS SET text = 7 WHERE text = 'ncclCommInitRank'")
    db.commit()
    db.close()
    r = run_cli("analyze", str(p), "--json", "--jobs", "1")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    t = json.loads(r.stdout)["phases"]["trace"]["all_to_all"]
    assert t["sizes"] == "not recorded" and t["finding"] is None, t


def _one_call_all_to_all(src, dst, with_init: bool) -> dict[int, list[int]]:
    """A copy of the real export whose every group is NCCL 2.28's one-call ncclAlltoAll instead: one
    range from the group's start to its end (the kernel's launch inside it, as NCCL launches it),
    its payload {communicator, bytes per peer} in a schema added as nsys would export NCCL's
    (NcclNvtxParamsAlltoAll); with or without the processes' ncclCommInitRank (their ranks 0 and 1).
    Returns per pid the bytes per peer of each call, in order."""
    shutil.copy(src, dst)
    db = sqlite3.connect(dst)
    sid = 16777240
    db.execute("INSERT INTO NVTX_PAYLOAD_SCHEMAS (domainId, schemaId, type, numEntries, payloadSize) "
               "VALUES (1, ?, 1, 2, 16)", (sid,))
    db.execute('INSERT INTO NVTX_PAYLOAD_SCHEMA_ENTRIES (domainId, schemaId, idx, "type", name, "offset") VALUES '
               "(1, ?, 0, 18, 'NCCL communicator ID', NULL), (1, ?, 1, 22, 'Message size [bytes]', 8)", (sid, sid))
    init = db.execute("SELECT DISTINCT payloadSize FROM NVTX_PAYLOAD_SCHEMAS WHERE schemaId = 16777218").fetchone()[0]
    comm, written = 0x5EED_C0FFEE, {}
    for pid, rank in ((145, 0), (144, 1)):
        rows = db.execute("SELECT n.rowid, coalesce(n.text, s.value), n.start, n.globalTid FROM NVTX_EVENTS n "
                          "LEFT JOIN StringIds s ON s.id = n.textId WHERE ((n.globalTid >> 24) & 16777215) = ? AND "
                          "coalesce(n.text, s.value) IN ('ncclGroupStart', 'ncclSend', 'ncclRecv', 'ncclGroupEnd') "
                          "ORDER BY n.start", (pid,)).fetchall()
        out, first = [], None
        for rowid, name, start, _ in rows:
            if name == "ncclGroupStart":
                first = start
            if name != "ncclGroupEnd":
                db.execute("DELETE FROM NVTX_EVENTS WHERE rowid = ?", (rowid,))
                continue
            out.append((1 + rank) * MIB + len(out) * 4096)
            blob = struct.pack("<QQQQ", 1, sid, 16, 32) + struct.pack("<QQ", comm, out[-1])
            db.execute("UPDATE NVTX_EVENTS SET text = 'ncclAlltoAll', textId = NULL, start = ?, binaryData = ? "
                       "WHERE rowid = ?", (first, blob, rowid))
        if with_init:
            _init_range(db, rows[0], struct.pack("<QQQQ", 1, 16777218, init, 32)
                        + struct.pack("<Qiii", comm, 2, rank, 0).ljust(init, b"\0"))
        written[pid] = out
    return _blobs_exported(db, written)


@needs_real
def test_ncclalltoall_is_an_even_split_and_a_matrix_where_the_communicator_is_known(tmp_path):
    """NCCL 2.28's one-call all-to-all sends every peer the same bytes: without the communicator's
    size the calls are even splits (no routing skew can show in bytes), with it (ncclCommInitRank)
    the matrix, each call's bytes to every peer: rank 0 sends 1 MiB + n x 4 KiB to each, rank 1 twice."""
    p = tmp_path / "even.sqlite"
    _one_call_all_to_all(BEFORE, p, with_init=False)
    t = analyze(p)["phases"]["trace"]["all_to_all"]
    assert (t["sizes"], t["even_calls"], t["unsized_calls"], t["finding"]) == ("even splits", 32, 0, None), t
    q = tmp_path / "matrix.sqlite"
    written = _one_call_all_to_all(BEFORE, q, with_init=True)
    t = analyze(q)["phases"]["trace"]["all_to_all"]
    sent = {0: sum(written[145][:32]), 1: sum(written[144][:32])}  # rank -> bytes per peer over the 32 calls
    assert t["sizes"] == "recorded" and t["matrix"] == [[sent[0], sent[0]], [sent[1], sent[1]]], t
    assert t["received"] == [sent[0] + sent[1]] * 2 and t["imbalance"] == 1.0 and t["skew"] is None


@needs_real
def test_each_kernel_is_named_by_its_communicator_and_two_communicators_are_never_one_call(tmp_path):
    """NCCL's payloads name each call's communicator: the kernels take it as their process group (with
    its size from ncclCommInitRank), so the calls of two communicators are never matched as one
    collective, however alike their order. One communicator: every all-to-all matched, as before;
    the same calls on two communicators of 2 ranks each, one process of each here: none matched (the
    first SendRecv kernel, launched before the window, names no communicator and still pairs)."""
    same, apart = tmp_path / "same.sqlite", tmp_path / "apart.sqlite"
    _fill(BEFORE, same, {144: 1, 145: 0})
    _fill(BEFORE, apart, {144: 1, 145: 0}, comm_of={144: 0xA, 145: 0xB})
    a, b = analyze(same), analyze(apart)
    t = a["phases"]["trace"]["all_to_all"]
    assert t["group"] == "nccl comm 0x0000005eedc0ffee" and t["sized_calls"] == 32 and t["time"]["calls"] == 32
    assert a["collectives"]["matched_calls"] == 33 and b["collectives"]["matched_calls"] == 1
    u = b["phases"]["trace"]["all_to_all"]
    assert {u["group"], u["other_groups"][0]["group"]} == {"nccl comm 0x000000000000000a", "nccl comm 0x000000000000000b"}
    assert u["finding"] is None and "time" not in u and "no call is held by every rank of the group" in u["note"], u
    # without ncclCommInitRank in the window (its size then from the peers its sends name): the same matching
    for comm_of, matched in ((None, 33), ({144: 0xA, 145: 0xB}, 1)):
        p = tmp_path / f"no-init-{matched}.sqlite"
        _fill(BEFORE, p, {144: 1, 145: 0}, comm_of=comm_of, init=False)
        assert analyze(p)["collectives"]["matched_calls"] == matched
