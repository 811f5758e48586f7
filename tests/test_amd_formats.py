"""AMD's other two trace formats (issue: RPD and rocprofv3 JSON): the real files in
tests/data/traces/amd/ analyze with exactly the counts an independent script (sqlite3, json) finds
in them; synthetic files built on the real files' schema cover what the real ones lack (an RCCL
kernel under a PyTorch op in RPD; hip_api, rccl_api and roctx ranges in rocprofv3 JSON); bad
input is one line and exit 2."""

from __future__ import annotations

import copy
import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from commprobe.analyzers.analysis import analyze
from tests.conftest import assert_one_line_exit_2, run_cli

AMD = Path(__file__).resolve().parents[1] / "tests" / "data" / "traces" / "amd"
RPD = AMD / "rpd_vllm_mi300_mytrace.rpd.gz"
ROCPROF = AMD / "rocprofv3_mi350_pid908_results.json.gz"
needs_shared = pytest.mark.usefixtures("real_traces")  # the real AMD files ship in tests/data


@pytest.fixture(scope="module")
def rpd_plain(tmp_path_factory) -> Path:
    """The real RPD file inflated (sqlite3 reads plain files), for the independent count."""
    out = tmp_path_factory.mktemp("rpd") / "mytrace.rpd"
    with gzip.open(RPD) as f, open(out, "wb") as w:
        shutil.copyfileobj(f, w)
    return out


def _rpd_truth(path: Path) -> dict:
    """Kernels (roctracer's KernelExecution and graph-launched Task ops), copies, RCCL kernels and
    their summed durations, straight from rocpd_op (ns -> µs)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    q = ("SELECT count(*), coalesce(sum(O.end - O.start), 0) FROM rocpd_op O JOIN rocpd_string T ON T.id = O.opType_id "
         "JOIN rocpd_string D ON D.id = O.description_id WHERE ")
    kernel = db.execute(q + "T.string IN ('KernelExecution', 'Task')").fetchone()
    copies = db.execute(q + "T.string LIKE 'Copy%'").fetchone()
    rccl = db.execute(q + "T.string IN ('KernelExecution', 'Task') AND (D.string LIKE 'nccl%' OR D.string LIKE 'rccl%'"
                      " OR D.string LIKE 'mscclKernel%')").fetchone()
    db.close()
    return {"kernel": {"n": kernel[0], "us": kernel[1] / 1000}, "memcpy": {"n": copies[0], "us": copies[1] / 1000},
            "comm_kernel": {"n": rccl[0], "us": rccl[1] / 1000}}


def _work(result: dict) -> dict:
    (rank,) = result["ranks"]
    return {k: v for k, v in rank["device_work"].items() if k in ("kernel", "memcpy", "comm_kernel")}


def _close(a: dict, b: dict) -> bool:
    return all(a[k]["n"] == b[k]["n"] and abs(a[k]["us"] - b[k]["us"]) < 1e-3 for k in a)


@needs_shared
def test_the_real_rpd_file_analyzes_with_the_counts_sqlite_finds(rpd_plain):
    truth = _rpd_truth(rpd_plain)
    assert truth["kernel"]["n"] == 8948 and truth["memcpy"]["n"] == 1176  # what the file holds (the README's facts)
    r = analyze(RPD)
    assert _close(_work(r), truth), (_work(r), truth)
    assert r["source"]["formats"] == {"rpd 2": 1}
    assert r["graphs"]["0"] == {"launches": 20, "capture_calls": 0, "empty_replays": 0, "state": "replays"}  # 20 hipGraphLaunch
    # the gzip file and the plain one give one analysis
    plain = analyze(rpd_plain)
    assert _work(plain) == _work(r) and plain["phases"] == r["phases"]


def _rocprof_truth(doc: dict) -> dict:
    out = {"kernel": {"n": 0, "us": 0.0}, "memcpy": {"n": 0, "us": 0.0}, "comm_kernel": {"n": 0, "us": 0.0}}
    for p in doc["rocprofiler-sdk-tool"]:
        names = {s["kernel_id"]: s["formatted_kernel_name"] for s in p["kernel_symbols"]}
        for d in p["buffer_records"]["kernel_dispatch"]:
            us = (d["end_timestamp"] - d["start_timestamp"]) / 1000
            out["kernel"]["n"] += 1
            out["kernel"]["us"] += us
            if names[d["dispatch_info"]["kernel_id"]].startswith(("ncclDevKernel", "rccl", "mscclKernel")):
                out["comm_kernel"]["n"] += 1
                out["comm_kernel"]["us"] += us
        for c in p["buffer_records"]["memory_copy"]:
            out["memcpy"]["n"] += 1
            out["memcpy"]["us"] += (c["end_timestamp"] - c["start_timestamp"]) / 1000
    return out


@pytest.fixture(scope="module")
def rocprof_doc() -> dict:
    return json.loads(gzip.decompress(ROCPROF.read_bytes()))


@needs_shared
def test_the_real_rocprofv3_json_analyzes_with_the_counts_json_finds(rocprof_doc):
    truth = _rocprof_truth(rocprof_doc)
    assert truth["kernel"]["n"] == 43915 and truth["comm_kernel"]["n"] > 0
    r = analyze(ROCPROF)
    assert _close(_work(r), truth), (_work(r), truth)
    assert r["source"]["formats"] == {"rocprofv3 json": 1}
    # dispatches only: said, and the RCCL kernels are communication of unknown op, counted as unlinked
    assert any("no kernel can be linked to its launch" in n for n in r["source"]["reader_notes"])
    assert r["kernel_links"]["comm_kernels"] == truth["comm_kernel"]["n"] == r["kernel_links"]["no_launch"]
    assert r["ranks"][0]["phases"]["trace"]["categories"]["other_comm"]["total_us"] > 0


# --- synthetic files on the real schema ---------------------------------------------------------

def _rpd_like(real: Path, out: Path) -> sqlite3.Connection:
    """An empty RPD with the real file's tables (their CREATE statements read from it)."""
    src = sqlite3.connect(f"file:{real}?mode=ro", uri=True)
    ddl = [sql for (name, sql) in src.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'")
           if sql and not name.startswith("sqlite_")]
    src.close()
    db = sqlite3.connect(out)
    for sql in ddl:
        db.execute(sql)
    db.execute("INSERT INTO rocpd_metadata (tag, value) VALUES ('schema_version', '2')")
    return db


def _strings(db, *names) -> list[int]:
    ids = []
    for s in names:
        db.execute("INSERT INTO rocpd_string (string) VALUES (?)", (s,))
        ids.append(db.execute("SELECT last_insert_rowid()").fetchone()[0])
    return ids


@needs_shared
def test_an_rpd_rccl_kernel_takes_its_collective_from_the_pytorch_op_that_launched_it(rpd_plain, tmp_path):
    """rpd records no RCCL API: an `ncclDevKernel_Generic` kernel (which names no collective) is an
    allreduce because the PyTorch op around its launch says so; the same kernel launched under no
    op is communication of unknown op, counted."""
    p = tmp_path / "rank3.rpd"
    db = _rpd_like(rpd_plain, p)
    empty, marker, launch, kexec, gemm, rccl, op, step = _strings(
        db, "", "UserMarker", "hipExtLaunchKernel", "KernelExecution", "Cijk_gemm", "ncclDevKernel_Generic_1(x)",
        "nccl:all_reduce", "ProfilerStep#1")
    pid, tid, t0 = 77, 77, 1_000_000_000
    apis = [  # (id, start, end, name, args)
        (1, t0, t0 + 900_000, marker, step),
        (2, t0 + 10_000, t0 + 15_000, launch, empty),  # the gemm's launch
        (3, t0 + 20_000, t0 + 40_000, marker, op),  # nccl:all_reduce ...
        (4, t0 + 25_000, t0 + 30_000, launch, empty),  # ... launches the RCCL kernel
        (5, t0 + 50_000, t0 + 55_000, launch, empty),  # an RCCL kernel launched under no op
    ]
    for i, a, b, name, args in apis:
        db.execute("INSERT INTO rocpd_api (id, pid, tid, start, end, apiName_id, args_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
                   (i, pid, tid, a, b, name, args))
    ops = [(1, t0 + 20_000, t0 + 120_000, gemm, 2), (2, t0 + 130_000, t0 + 330_000, rccl, 4),
           (3, t0 + 340_000, t0 + 440_000, rccl, 5)]
    for i, a, b, desc, api in ops:
        db.execute("INSERT INTO rocpd_op (id, gpuId, queueId, sequenceId, completionSignal, start, end, description_id, "
                   "opType_id) VALUES (?, 3, 0, 0, '', ?, ?, ?, ?)", (i, a, b, desc, kexec))
        db.execute("INSERT INTO rocpd_api_ops (api_id, op_id) VALUES (?, ?)", (api, i))
    db.commit()
    db.close()
    r = analyze(p)
    assert r["ranks"][0]["rank"] == 3  # `rank3` in the file name, the rule of every multi-rank reader
    assert r["ranks"][0]["device_work"]["comm_kernel"] == {"n": 2, "us": 300.0}
    assert r["kernel_links"]["comm_kernels"] == 2 and r["kernel_links"]["linked"] == 1
    assert r["kernel_links"]["outside_host_op"] == 1
    cats = r["ranks"][0]["phases"]["step"]["categories"]
    assert cats["tp_allreduce"]["total_us"] == pytest.approx(200.0)  # the linked one: an allreduce
    assert cats["other_comm"]["total_us"] == pytest.approx(100.0)  # the other: op unknown
    assert r["ranks"][0]["phase_rule"]["rule"] != "whole-trace"


@needs_shared
def test_rocprofv3_json_with_launches_rccl_api_and_roctx_ranges(rocprof_doc, tmp_path):
    """What the shared file lacks, built on its own strings, agents and kernel symbols: hip_api
    launches tie dispatches to host calls, an rccl_api ncclAllReduce around a launch names the RCCL
    kernel's collective, and roctx ranges (marker_api, text in strings.marker_api) are the steps."""
    proc = copy.deepcopy(rocprof_doc["rocprofiler-sdk-tool"][0])
    names = proc["strings"]["buffer_records"]
    kind = {k["kind"]: i for i, k in enumerate(names)}
    hip, rccl_k, marker = kind["HIP_RUNTIME_API"], kind["RCCL_API"], kind["MARKER_CORE_API"]
    launch = names[hip]["operations"].index("hipLaunchKernel")
    allreduce = names[rccl_k]["operations"].index("ncclAllReduce")
    push = names[marker]["operations"].index("roctxRangePushA")
    syms = {s["formatted_kernel_name"]: s["kernel_id"] for s in proc["kernel_symbols"]}
    nccl = next(i for n, i in syms.items() if n.startswith("ncclDevKernel"))
    gemm = next(i for n, i in syms.items() if n and not n.startswith(("ncclDevKernel", "__amd")))
    gpu = next(a["id"]["handle"] for a in proc["agents"] if a["type"] == 2)
    t0, tid = 5_000_000_000, 908

    def rec(k, op, a, b, corr):
        return {"size": 0, "kind": k, "operation": op, "thread_id": tid, "correlation_id": {"internal": corr, "external": 0},
                "start_timestamp": a, "end_timestamp": b}

    def dispatch(kid, a, b, corr):
        return {"size": 0, "kind": kind["KERNEL_DISPATCH"], "operation": 2, "thread_id": tid,
                "correlation_id": {"internal": corr, "external": 0}, "start_timestamp": a, "end_timestamp": b,
                "dispatch_info": {"agent_id": {"handle": gpu}, "queue_id": {"handle": 1}, "kernel_id": kid}}

    br = {k: [] for k in proc["buffer_records"]}
    for step in range(2):
        s = t0 + step * 1_000_000
        br["marker_api"].append(rec(marker, push, s, s + 900_000, 100 + step))
        br["hip_api"].append(rec(hip, launch, s + 10_000, s + 15_000, 10 * step + 1))
        br["rccl_api"].append(rec(rccl_k, allreduce, s + 20_000, s + 40_000, 10 * step + 2))
        br["hip_api"].append(rec(hip, launch, s + 25_000, s + 30_000, 10 * step + 3))
        br["kernel_dispatch"].append(dispatch(gemm, s + 20_000, s + 120_000, 10 * step + 1))
        br["kernel_dispatch"].append(dispatch(nccl, s + 130_000, s + 330_000, 10 * step + 3))
    proc["buffer_records"] = br
    proc["strings"]["marker_api"] = [{"key": 100, "value": "ProfilerStep#1"}, {"key": 101, "value": "ProfilerStep#2"}]
    p = tmp_path / "host_908_results.json"
    p.write_text(json.dumps({"rocprofiler-sdk-tool": [proc]}))
    r = analyze(p)
    assert r["source"]["reader_notes"] == []
    assert r["kernel_links"]["comm_kernels"] == 2 == r["kernel_links"]["linked"]
    step = r["ranks"][0]["phases"]["step"]
    assert step["windows"] == 2
    assert step["categories"]["tp_allreduce"]["total_us"] == pytest.approx(400.0)
    assert step["categories"]["compute"]["total_us"] == pytest.approx(200.0)


# --- bad input ------------------------------------------------------------------------------------

def _one_line_exit_2(path: Path, needle: str) -> None:
    assert_one_line_exit_2(run_cli("analyze", str(path)), needle)


@needs_shared
def test_bad_rpd_and_rocprofv3_files_are_one_line(rpd_plain, rocprof_doc, tmp_path):
    cut = tmp_path / "cut.rpd"
    cut.write_bytes(rpd_plain.read_bytes()[: 200_000])
    _one_line_exit_2(cut, "cut.rpd")
    cut_gz = tmp_path / "cut.rpd.gz"
    cut_gz.write_bytes(RPD.read_bytes()[: 300_000])
    _one_line_exit_2(cut_gz, "truncated or corrupt gzip")
    other = tmp_path / "other.db"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    _one_line_exit_2(other, "tried: Nsight Systems export, rocprofv3 rocpd database, RPD file")
    # the tool key, a section missing: what stands is read (the GPU indexes are unknown), and said
    proc = {k: v for k, v in rocprof_doc["rocprofiler-sdk-tool"][0].items() if k != "agents"}
    (tmp_path / "noagents.json").write_text(json.dumps({"rocprofiler-sdk-tool": [proc]}))
    a = analyze(tmp_path / "noagents.json")
    assert "noagents.json: no readable agents section" in a["source"]["reader_notes"]
    assert a["ranks"][0]["device_work"]["kernel"]["n"] == 43915
    # a process without its metadata (pid) is refused in one line
    proc = {k: v for k, v in rocprof_doc["rocprofiler-sdk-tool"][0].items() if k != "metadata"}
    (tmp_path / "nometa.json").write_text(json.dumps({"rocprofiler-sdk-tool": [proc]}))
    _one_line_exit_2(tmp_path / "nometa.json", "lacks its metadata")


@needs_shared
def test_rocprofv3_records_whose_ids_point_nowhere_are_counted(rocprof_doc, tmp_path):
    proc = copy.deepcopy(rocprof_doc["rocprofiler-sdk-tool"][0])
    proc["buffer_records"]["kernel_dispatch"][0]["dispatch_info"]["kernel_id"] = 10 ** 9
    p = tmp_path / "x_results.json"
    p.write_text(json.dumps({"rocprofiler-sdk-tool": [proc]}))
    r = analyze(p)
    assert any(n.startswith("rocprofv3 JSON: 1 ids") for n in r["source"]["reader_notes"]), r["source"]["reader_notes"]
    assert r["ranks"][0]["device_work"]["kernel"]["n"] == 43915  # the record is kept, named by its id


@needs_shared
def test_an_rpd_locked_by_its_writer_is_one_line(rpd_plain, tmp_path):
    p = tmp_path / "live.rpd"
    shutil.copy(rpd_plain, p)
    writer = sqlite3.connect(p)
    writer.execute("PRAGMA locking_mode = EXCLUSIVE")
    writer.execute("BEGIN EXCLUSIVE")
    try:
        _one_line_exit_2(p, "locked")
    finally:
        writer.rollback()
        writer.close()
