"""Many ranks (issue: scale): the per-rank map in a local process pool gives the same analysis as
one process, and a bad rank among many is one line naming its file."""

from __future__ import annotations

import gzip
import json

from commprobe.analyzers.analysis import analyze
from tests.conftest import run_cli


def _rank(r: int, late: float) -> dict:
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 2000, "pid": 0, "tid": 1}]
    for k in range(4):
        t0 = 400 * k
        ev.append({"ph": "X", "cat": "kernel", "name": "gemm", "ts": t0, "dur": 200, "pid": 0, "tid": 7})
        ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)",
                   "ts": t0 + 200 + late, "dur": 100 - late if late < 100 else 10, "pid": 0, "tid": 20,
                   "args": {"Collective name": "allreduce", "In msg nelems": 1024, "dtype": "Float",
                            "Group size": 4, "Process Group Name": "0", "Process Group Description": "tp"}})
    return {"schemaVersion": 1, "baseTimeNanoseconds": 1_700_000_000_000_000_000,
            "distributedInfo": {"rank": r, "world_size": 4}, "traceEvents": ev}


def _run(tmp_path, bad: str | None = None):
    d = tmp_path / "run"
    d.mkdir()
    for r in range(4):
        with gzip.open(d / f"rank{r}.trace.json.gz", "wt") as f:
            json.dump(_rank(r, 0 if r != 2 else 50), f)
    if bad:
        (d / "rank1.trace.json.gz").write_bytes(bad.encode())
    return d


def _strip(doc: dict) -> dict:
    doc.pop("elapsed_s")
    return doc


def test_jobs_give_the_same_analysis(tmp_path, shared_traces):
    d = _run(tmp_path)
    one, two = _strip(analyze(d, jobs=1)), _strip(analyze(d, jobs=2))
    assert one == two
    assert one["collectives"]["straggler"] == 2 and one["collectives"]["matched_calls"] == 4
    real = shared_traces / "facebookresearch-param"
    assert _strip(analyze(real, jobs=1)) == _strip(analyze(real, jobs=3))


def test_cli_jobs_and_a_bad_rank_named_in_one_line(tmp_path):
    d = _run(tmp_path)
    a = json.loads(run_cli("analyze", str(d), "--json", "--jobs", "1").stdout)
    b = json.loads(run_cli("analyze", str(d), "--json", "--jobs", "2").stdout)
    assert _strip(a) == _strip(b)
    (tmp_path / "bad").mkdir()
    bad = _run(tmp_path / "bad", bad="not a trace")
    r = run_cli("analyze", str(bad), "--jobs", "2")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "rank1.trace.json.gz" in lines[0] and "Traceback" not in r.stderr
