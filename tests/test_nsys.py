"""Nsight Systems SQLite exports (issue: Nsight and rocprofv3 exports): the real exports read
exactly, a synthetic NCCL export analyzes like the same scenario written as Kineto JSON, and bad
input is one line, exit 2."""

from __future__ import annotations

import json
import shutil
import sqlite3

import numpy as np
import pytest

from commprobe.analyzers.analysis import analyze
from commprobe.analyzers.readers.sources import traces_in
from tests.conftest import ROOT, run_cli

PIPIT = ROOT / "tests" / "data" / "traces" / "hpcgroup-pipit"
SAXPY = PIPIT / "saxpy-mpi-cuda_nsys_perlmutter0.sqlite"
CLOVER = PIPIT / "perlmutter-cloverleaf-cuda.sqlite"
needs_pipit = pytest.mark.usefixtures("real_traces")  # the real exports ship in tests/data (fails, never skips, without them)


def _sql(path, q, *args):
    db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return db.execute(q, args).fetchall()
    finally:
        db.close()


def _named(t, cat):
    idx = np.flatnonzero(np.array(t.cats)[t.cat_id] == cat)
    return idx, [t.names[i] for i in t.name_id[idx]]


@needs_pipit
def test_the_saxpy_export_reads_exactly():
    """Schema 2.9.1 (Nsight 2022.2): every kernel, copy and NVTX range, the runtime calls once each
    (this schema writes each call twice under one correlation id), counted here by SQL."""
    (t,) = list(traces_in(SAXPY))
    assert t.extra["format"] == "nsys-sqlite 2.9.1" and t.rank == 0  # the thread "MPI Rank 0"
    assert t.origin_ns == 1687813257637297504
    k, knames = _named(t, "kernel")
    assert len(k) == 5 and set(knames) == {"saxpy(double *, double *, double *, double, int)"}
    assert t.arg_corr[k].tolist() == [140, 156, 172, 188, 204]
    first = k[0]
    assert (t.ts[first], t.dur[first]) == (924922186 / 1000, (942626994 - 924922186) / 1000)
    m, mnames = _named(t, "gpu_memcpy")
    assert len(m) == 15 == _sql(SAXPY, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY")[0][0]
    r, _ = _named(t, "cuda_runtime")
    total, distinct = _sql(SAXPY, "SELECT count(*), count(DISTINCT correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME")[0]
    assert total == 95 and len(r) == distinct
    launches = [i for i in r if t.names[t.name_id[i]].startswith("cudaLaunchKernel")]
    assert sorted(t.arg_corr[launches].tolist()) == [140, 156, 172, 188, 204]
    launch = next(i for i in launches if t.arg_corr[i] == 140)  # the outer of the two rows
    assert (t.ts[launch], t.names[t.name_id[launch]]) == (924889832 / 1000, "cudaLaunchKernel")
    n, nnames = _named(t, "user_annotation")
    ranges = _sql(SAXPY, "SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL")[0][0]
    assert len(n) == ranges == 22
    truth = dict(_sql(SAXPY, "SELECT coalesce(n.text, s.value), count(*) FROM NVTX_EVENTS n LEFT JOIN StringIds s "
                             "ON s.id = n.textId WHERE eventType IN (59, 60) AND end IS NOT NULL GROUP BY 1"))
    assert {x: nnames.count(x) for x in set(nnames)} == truth and truth["saxpy"] == 5
    i = nnames.index("MPI_Init")
    assert (t.ts[n[i]], t.dur[n[i]]) == (65117824 / 1000, (710796807 - 65117824) / 1000)


@needs_pipit
def test_the_cloverleaf_export_reads_exactly_and_analyzes():
    """Schema 3.13.2 (Nsight 2024.5): 1,312 kernels each linked to its cudaLaunchKernel_v7000 by
    correlation id, 279 copies, 3,048 runtime calls (no duplicates in this schema)."""
    (t,) = list(traces_in(CLOVER))
    assert t.extra["format"] == "nsys-sqlite 3.13.2"
    k, _ = _named(t, "kernel")
    m, mnames = _named(t, "gpu_memcpy")
    r, rnames = _named(t, "cuda_runtime")
    assert (len(k), len(m), len(r)) == (1312, 279, 3048)
    kinds = dict(_sql(CLOVER, "SELECT e.label, count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY c "
                              "JOIN ENUM_CUDA_MEMCPY_OPER e ON e.id = c.copyKind GROUP BY 1"))
    assert {n: mnames.count(n) for n in set(mnames)} == {
        {"Host-to-Device": "Memcpy HtoD", "Device-to-Host": "Memcpy DtoH", "Device-to-Device": "Memcpy DtoD"}[lab]: c
        for lab, c in kinds.items()}
    launch_corr = {int(c) for i, c in zip(r, t.arg_corr[r]) if rnames[list(r).index(i)] == "cudaLaunchKernel_v7000"}
    assert set(t.arg_corr[k].tolist()) <= launch_corr and len(set(t.arg_corr[k].tolist())) == 1312
    a = analyze(CLOVER)
    assert a["kernel_links"]["comm_kernels"] == 0 and a["ranks"][0]["timeline"] == "device"
    busy = a["ranks"][0]["phases"]["trace"]["categories"]
    total = _sql(CLOVER, "SELECT sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0] / 1000
    assert busy["compute"]["total_us"] == pytest.approx(total, rel=1e-9)  # one stream: no overlap to merge


# --- a synthetic NCCL scenario, as an Nsight export and as Kineto JSON -------------------------

ORIGIN = 1_700_000_000_000_000_000
AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
SR = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"


def scenario(rank: int) -> list[dict]:
    """Per rank: a prefill then three decode steps (TensorRT-LLM's NVTX step ranges), each a GEMM,
    an NCCL allreduce (rank 1's kernel starts 50 µs late: rank 0 waits) and an NCCL all-to-all run
    as SendRecv kernels, and a host-to-device copy; every device event launched by a runtime call."""
    ev, corr = [], 100
    for step in range(4):
        b = step * 1_000_000
        ctx, gen = (1, 0) if step == 0 else (0, 2)
        ev.append(dict(kind="nvtx", start=b, end=b + 900_000, name=f"[Executor] _forward_step {step}: {ctx} ctx reqs, "
                                                                   f"{gen} gen reqs"))
        for host, kname, ks, ke, hs, he in (
                (None, "gemm_bf16_kernel", 20_000, 300_000, 10_000, 15_000),
                ("ncclAllReduce", AR, 330_000 + 50_000 * rank, 500_000, 315_000, 320_000),
                ("ncclAllToAll", SR, 520_000, 560_000, 505_000, 510_000)):
            corr += 1
            if host:
                ev.append(dict(kind="nvtx", start=b + hs - 2_000, end=b + he + 2_000, name=host))
            ev.append(dict(kind="runtime", start=b + hs, end=b + he, name="cudaLaunchKernel", corr=corr))
            ev.append(dict(kind="kernel", start=b + ks, end=b + ke, name=kname, corr=corr))
        corr += 1
        ev.append(dict(kind="runtime", start=b + 590_000, end=b + 600_000, name="cudaMemcpyAsync", corr=corr))
        ev.append(dict(kind="memcpy", start=b + 600_000, end=b + 650_000, name="Memcpy HtoD", corr=corr))
    return ev


def write_kineto(path, rank: int) -> None:
    cat = {"nvtx": "user_annotation", "runtime": "cuda_runtime", "kernel": "kernel", "memcpy": "gpu_memcpy"}
    events = [{"ph": "X", "cat": cat[e["kind"]], "name": e["name"], "ts": e["start"] / 1000,
               "dur": (e["end"] - e["start"]) / 1000, "pid": rank, "tid": 7 if e["kind"] in ("kernel", "memcpy") else 1,
               **({"args": {"correlation": e["corr"]}} if "corr" in e else {})} for e in scenario(rank)]
    path.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": ORIGIN}))


TABLES = {CLOVER: ("StringIds", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
                   "META_DATA_EXPORT", "TARGET_INFO_SESSION_START_TIME", "ThreadNames", "ENUM_CUDA_MEMCPY_OPER",
                   "TARGET_INFO_SYSTEM_ENV"),
          SAXPY: ("NVTX_EVENTS",)}


def write_nsys(path, ranks=(0, 1), version="3.13.2", one_process: bool = False, torchrun: bool = False,
               host: str | None = None, process: tuple[int, int] | None = None, nccl_rank: int | None = None) -> None:
    """An export with the real files' table definitions (sqlite_master), two processes = two ranks
    (one_process: one process driving one GPU per rank, its threads one per rank; torchrun: each
    process on the device of its local rank, threads not named, the later rank with the lower pid;
    process=(pid, device): one process on one device, threads not named, as one export per process
    of a multi-node collection writes it; host: the Hostname the export records; nccl_rank: the
    rank NCCL's ncclCommInitRank NVTX payload records for the world communicator, beside a
    one-rank sub-communicator's)."""
    db = sqlite3.connect(path)
    for src, tables in TABLES.items():
        for name in tables:
            db.execute(_sql(src, "SELECT sql FROM sqlite_master WHERE name = ?", name)[0][0])
    db.executemany("INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES (?, ?, ?)", [(1, "CUDA_MEMCPY_KIND_HTOD", "Host-to-Device")])
    db.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', ?)", (version,))
    db.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (ORIGIN,))
    if host is not None:
        db.execute("INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (0, 'Local (CLI)', 'Hostname', 400, ?)", (host,))
    strings: dict[str, int] = {}

    def sid(s: str) -> int:
        if s not in strings:
            strings[s] = len(strings) + 1
            db.execute("INSERT INTO StringIds VALUES (?, ?)", (strings[s], s))
        return strings[s]

    kcols = [r[1] for r in db.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")]
    mcols = [r[1] for r in db.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_MEMCPY)")]
    for rank in ranks:
        pid = 4000 if one_process else 4000 + (len(ranks) - 1 - rank if torchrun else rank)
        device, offset = (rank, 10_000 * rank) if one_process else (rank if torchrun else 0, 0)
        if process is not None:
            pid, device = process
        gpid, gtid = (1 << 56) | (pid << 24), (1 << 56) | (pid << 24) | (pid + 5 + rank)
        if nccl_rank is not None:  # NCCL's payload entries (NVIDIA/nccl nvtx_payload_schemas.h), as nsys exports them
            for n, r in ((2, nccl_rank), (1, 0)):
                db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, jsonText) "
                           "VALUES (?, ?, 59, 'ncclCommInitRank', ?, ?)",
                           (100 + n, 200 + n, gtid, json.dumps({"NCCL communicator ID": 77 + n, "No. of ranks": n,
                                                                "Rank": r, "CUDA device": device})))
        if not torchrun and process is None:
            db.execute("INSERT INTO ThreadNames (nameId, priority, globalTid) VALUES (?, 0, ?)",
                       (sid(f"NCCL rank {rank}"), gtid))
        for e in scenario(rank):
            if e["kind"] == "kernel":
                row = dict(start=e["start"], end=e["end"], deviceId=device, contextId=1, streamId=7,
                           correlationId=e["corr"] + offset, globalPid=gpid, demangledName=sid(e["name"]),
                           shortName=sid(e["name"][:20]),
                           gridX=1, gridY=1, gridZ=1, blockX=1, blockY=1, blockZ=1, staticSharedMemory=0,
                           dynamicSharedMemory=0, localMemoryPerThread=0, localMemoryTotal=0, gridId=e["corr"],
                           sharedMemoryExecuted=0, registersPerThread=32, launchType=0, cacheConfig=0)
                cols = [c for c in kcols if c in row]
                db.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL ({','.join(cols)}) VALUES ({','.join('?' * len(cols))})",
                           [row[c] for c in cols])
            elif e["kind"] == "memcpy":
                row = dict(start=e["start"], end=e["end"], deviceId=device, contextId=1, streamId=7,
                           correlationId=e["corr"] + offset, globalPid=gpid, bytes=1 << 20, copyKind=1)
                cols = [c for c in mcols if c in row]
                db.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY ({','.join(cols)}) VALUES ({','.join('?' * len(cols))})",
                           [row[c] for c in cols])
            elif e["kind"] == "runtime":
                db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, "
                           "nameId, returnValue) VALUES (?, ?, 0, ?, ?, ?, 0)",
                           (e["start"], e["end"], gtid, e["corr"] + offset, sid(e["name"])))
            else:
                db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 59, ?, ?)",
                           (e["start"], e["end"], e["name"], gtid))
    db.commit()
    db.close()


def _comparable(a: dict) -> dict:
    a = json.loads(json.dumps(a))
    for k in ("elapsed_s", "source"):
        a.pop(k)
    for r in a["ranks"]:
        for k in ("file", "rank_rule", "identity"):  # where the rank came from differs by format, not the answer
            r.pop(k)
    for p in a["phases"].values():  # why sizes are missing names what would mend it, which differs by format
        if p.get("all_to_all", {}).get("sizes") == "not recorded":
            p["all_to_all"]["note"] = p["all_to_all"]["note"].split(" cannot be told")[0]
    # which time told the last arriver follows the hosts the format records (rocpd: each rank's node),
    # not the answer: the scenario's calls end together, so both rules name the same rank
    a["collectives"].pop("arrival_rule")
    a["collectives"].pop("arrival_rule_why")
    return a


def test_a_synthetic_nccl_export_analyzes_like_the_same_scenario_in_kineto_json(tmp_path):
    kineto, sq = tmp_path / "kineto", tmp_path / "nsys"
    kineto.mkdir()
    sq.mkdir()
    for r in (0, 1):
        write_kineto(kineto / f"rank{r}.json", r)
    write_nsys(sq / "run.sqlite")
    a, b = analyze(kineto), analyze(sq / "run.sqlite")
    assert _comparable(b) == _comparable(a)
    # and the scenario's truth: 4 allreduces (TP, inferred from NCCL's range), 4 all-to-alls (EP)
    assert b["axis_provenance"] == {"tp_allreduce": {"inferred": 8}, "ep_all_to_all": {"inferred": 8}}
    assert b["kernel_links"]["linked"] == 16 and [r["rank"] for r in b["ranks"]] == [0, 1]
    assert set(b["ranks"][0]["phases"]) == {"prefill", "decode"} and b["ranks"][0]["phase_rule"]["rule"] == "trtllm"
    note = b["phases"]["decode"]["all_to_all"]["note"]  # its ncclAllToAll ranges, exported with no payload column
    assert "left out the payloads of NCCL's 4 ncclSend/ncclRecv/ncclAlltoAll NVTX ranges" in note, note
    waits = b["ranks"][0]["phases"]["decode"]["categories"]["tp_allreduce"]["exposed_wait_us"]
    assert waits == pytest.approx(3 * 50, rel=1e-6)  # rank 0 waits 50 µs for rank 1 in each decode step


def test_a_directory_of_exports_one_per_rank_and_the_rank_from_pattern(tmp_path):
    for r in (0, 1):
        write_nsys(tmp_path / f"node{r + 4}.sqlite", ranks=(r,))
    a = analyze(tmp_path)
    assert [r["rank"] for r in a["ranks"]] == [0, 1]  # from the "NCCL rank N" thread names
    r = run_cli("analyze", str(tmp_path / "node5.sqlite"), "--rank-from", r"node(\d+)", "--json", "--jobs", "1")
    assert r.returncode == 0, r.stderr
    assert [x["rank"] for x in json.loads(r.stdout)["ranks"]] == [5]


@pytest.mark.parametrize("case", ["not-a-database", "not-an-export", "unknown-schema", "truncated", "locked", "report"])
def test_bad_exports_are_one_line_exit_2(tmp_path, case):
    p = tmp_path / ("run.nsys-rep" if case == "report" else "run.sqlite")
    needle = {"not-a-database": "not a readable SQLite database", "not-an-export": "none of the formats read here",
              "unknown-schema": "schema 9.1 is not one this version reads", "truncated": "truncated or corrupt",
              "locked": "locked", "report": "nsys export --type sqlite"}[case]
    holder = None
    if case == "not-a-database":
        p.write_bytes(b"SQLite format 3\x00" + b"\x07" * 5000)
    elif case == "not-an-export":
        db = sqlite3.connect(p)
        db.execute("CREATE TABLE t (x)")
        db.commit()
        db.close()
    elif case in ("unknown-schema", "truncated", "locked"):
        write_nsys(p, version="9.1" if case == "unknown-schema" else "3.13.2")
        if case == "truncated":
            data = p.read_bytes()
            p.write_bytes(data[: len(data) // 3])
        if case == "locked":
            holder = sqlite3.connect(p, isolation_level=None)
            holder.execute("PRAGMA locking_mode = EXCLUSIVE")
            holder.execute("BEGIN EXCLUSIVE")
    else:
        if shutil.which("nsys"):
            pytest.skip("nsys is installed here: the report would be exported, not refused")
        p.write_bytes(b"\x00" * 64)
    try:
        r = run_cli("analyze", str(p), "--jobs", "1")
    finally:
        if holder is not None:
            holder.close()
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_a_process_driving_two_gpus_is_two_ranks_with_their_own_launches(tmp_path):
    p = tmp_path / "one-process.sqlite"
    write_nsys(p, one_process=True)
    ranks = list(traces_in(p))
    assert [(t.extra["pid"], t.extra["device"]) for t in ranks] == [(4000, 0), (4000, 1)]
    for t in ranks:
        k, _ = _named(t, "kernel")
        r, rnames = _named(t, "cuda_runtime")
        assert len(k) == 12 and len(_named(t, "gpu_memcpy")[0]) == 4
        # each part holds exactly the launches of its own device's work (correlation ids 101... / 10101...)
        assert sorted(t.arg_corr[r].tolist()) == sorted(t.arg_corr[np.concatenate([k, _named(t, "gpu_memcpy")[0]])].tolist())
    a = analyze(p)
    assert [r["rank"] for r in a["ranks"]] == [0, 1] and a["kernel_links"]["comm_kernels"] == 16


def test_a_multi_node_collection_named_host_pid_is_ranked_by_host_and_device(tmp_path):
    """One export per process on each of two nodes, named `<host>_<pid>` (nsys's %h_%p), CUDA devices
    0-2 on both, no rank recorded: ranks by (host, device), hosts in name order (as torchrun numbers
    them: node * 3 + local rank), the host read from the export itself; the late rank is found on
    its node. Before, the set was refused ("rank 1 appears in more than one file")."""
    pids = {("nodeA", 0): 7310, ("nodeA", 1): 7302, ("nodeA", 2): 7305,  # pid order is not device order
            ("nodeB", 0): 911, ("nodeB", 1): 955, ("nodeB", 2): 930}
    for (host, dev), pid in pids.items():
        late = 3 if (host, dev) == ("nodeB", 1) else 0  # scenario(3): its allreduce kernels start 150 µs late
        write_nsys(tmp_path / f"{host.lower()}_{pid}.sqlite", ranks=(late,), host=host, process=(pid, dev))
    a = analyze(tmp_path)
    assert a["source"]["rank_rule"] == "(host, device)"
    got = [(r["rank"], r["identity"]["host"], r["identity"]["device"], r["identity"]["pid"]) for r in a["ranks"]]
    assert got == [(h_idx * 3 + d, h, d, pids[(h, d)]) for h_idx, h in enumerate(("nodeA", "nodeB")) for d in range(3)]
    assert any("no rank recorded in 6 traces on 2 hosts; ranks from (host, device)" in n for n in a["source"]["reader_notes"])
    # the late process (nodeB, device 1) is rank 4, the straggler; the others wait 150 µs in each of 3 decode steps
    assert a["collectives"]["straggler"] == 4
    for r in a["ranks"]:
        waits = r["phases"]["decode"]["categories"]["tp_allreduce"]["exposed_wait_us"]
        assert waits == pytest.approx(0 if r["rank"] == 4 else 3 * 150, abs=1e-6)
    # two exports of one process (same host and pid) are the one set refused, naming both files
    write_nsys(tmp_path / "nodea_7310.again.sqlite", ranks=(0,), host="nodeA", process=(7310, 0))
    r = run_cli("analyze", str(tmp_path), "--jobs", "1")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "two traces of one process" in lines[0], r.stderr
    assert "nodea_7310.sqlite" in lines[0] and "nodea_7310.again.sqlite" in lines[0] and "--rank-from" in lines[0]


def test_ranks_from_ncclcomminitrank_payloads(tmp_path):
    """NCCL records each process's rank in the payload of its ncclCommInitRank NVTX range; nsys
    exports it as JSON text. Two exports named without a rank, devices 0 on both, no thread names:
    the ranks are NCCL's (the world communicator's, not the one-rank sub-communicator's)."""
    for pid, r in ((9001, 1), (9002, 0)):
        write_nsys(tmp_path / f"node_{pid}.sqlite", ranks=(r,), host=f"node{pid}", process=(pid, 0), nccl_rank=r)
    a = analyze(tmp_path)
    assert a["source"]["rank_rule"] == "the trace's own rank"
    assert [(r["rank"], r["identity"]["pid"]) for r in a["ranks"]] == [(0, 9002), (1, 9001)]


def test_a_multi_process_export_with_no_rank_recorded_takes_ranks_from_devices(tmp_path):
    """torchrun's local rank is the device: where nothing records a rank, the device index is a
    better guess than the order of first work (here the later rank's process has the lower pid and
    would come first), and the result says which rule chose the ranks."""
    p = tmp_path / "torchrun.sqlite"
    write_nsys(p, torchrun=True)
    ranks = list(traces_in(p))
    assert [(t.extra["pid"], t.extra["device"], t.rank, t.extra["rank_rule"]) for t in ranks] == \
        [(4000, 1, 1, "the device index"), (4001, 0, 0, "the device index")]
    a = analyze(p)
    assert any("no rank recorded in 2 traces; ranks from (host, device)" in n for n in a["source"]["reader_notes"])
    assert [r["rank"] for r in a["ranks"]] == [0, 1] and a["source"]["rank_rule"] == "(host, device)"
    assert [r["identity"] for r in a["ranks"]] == [{"pid": 4001, "device": 0}, {"pid": 4000, "device": 1}]
