"""Many ranks (issue: scale): the per-rank map in a local process pool gives the same analysis as
one process, and a bad rank among many is one line naming its file."""

from __future__ import annotations

import json

import pytest

from commprobe.analyzers.analysis import analyze
from tests.conftest import run_cli
from tests.kineto_events import HOST, SIDE, ev, kernel, write


def _rank(path, r: int, late: float) -> None:
    events = [ev("ProfilerStep#1", 0, 2000, HOST, "user_annotation")]
    for k in range(4):
        t0 = 400 * k
        events.append(kernel("gemm", t0, 200))
        events.append(kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", t0 + 200 + late,
                             100 - late if late < 100 else 10, SIDE, **{
                                 "Collective name": "allreduce", "In msg nelems": 1024, "dtype": "Float",
                                 "Group size": 4, "Process Group Name": "0", "Process Group Description": "tp"}))
    write(path, events, rank=r, world=4)


def _run(tmp_path, bad: str | None = None):
    d = tmp_path / "run"
    d.mkdir()
    for r in range(4):
        _rank(d / f"rank{r}.trace.json.gz", r, 0 if r != 2 else 50)
    if bad:
        (d / "rank1.trace.json.gz").write_bytes(bad.encode())
    return d


def _strip(doc: dict) -> dict:
    doc.pop("elapsed_s")
    return doc


def test_jobs_give_the_same_analysis(tmp_path, real_traces):
    d = _run(tmp_path)
    one, two = _strip(analyze(d, jobs=1)), _strip(analyze(d, jobs=2))
    assert one == two
    assert one["collectives"]["straggler"] == 2 and one["collectives"]["matched_calls"] == 4
    real = real_traces / "facebookresearch-param"
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


def _dask_cluster(tmp_path, workers: int = 2, env: dict | None = None):
    """A real local Dask cluster as a user starts one: `dask scheduler` and `dask worker` processes,
    on 127.0.0.1 only, stopped by the caller."""
    import os
    import shutil
    import subprocess
    import sys
    import time


    pytest.importorskip("distributed", reason="dask[distributed] is not installed (pip install 'commprobe[cluster]')")
    dask = shutil.which("dask", path=os.path.dirname(sys.executable)) or shutil.which("dask")
    if not dask:
        pytest.skip("the dask command is not on PATH")
    sched_file = tmp_path / "scheduler.json"
    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False", **(env or {})}
    procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                               "--scheduler-file", str(sched_file)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=env, cwd=tmp_path)]
    deadline = time.time() + 60
    while not sched_file.exists() and time.time() < deadline:
        time.sleep(0.2)
    for _ in range(workers):
        procs.append(subprocess.Popen([dask, "worker", "--scheduler-file", str(sched_file), "--nthreads", "1",
                                       "--nworkers", "1", "--no-dashboard", "--host", "127.0.0.1"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tmp_path))
    address = json.loads(sched_file.read_text())["address"]
    from distributed import Client

    with Client(address, timeout=30) as c:
        c.wait_for_workers(workers, timeout=60)
    return address, procs


def _stop(procs) -> None:
    for p in reversed(procs):
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except Exception:
            p.kill()


def test_a_real_dask_cluster_gives_the_same_analysis(tmp_path):
    d = _run(tmp_path)
    # The workers' processes carry the fault: the one analyzing diesonce/run/rank1 exits the first time.
    address, procs = _dask_cluster(tmp_path, env={"COMMPROBE_FAULT": "map-die-once:diesonce/run/rank1"})
    try:
        r = run_cli("analyze", str(d), "--json", "--scheduler", address)
        assert r.returncode == 0, r.stderr
        assert _strip(json.loads(r.stdout)) == _strip(analyze(d, jobs=1))
        # A URL: each worker opens the trace through fsspec itself (a zip archive on a file:// URL here;
        # s3:// and gs:// go the same way with s3fs or gcsfs installed).
        import zipfile

        with zipfile.ZipFile(tmp_path / "run.zip", "w") as z:
            for f in sorted(d.iterdir()):
                z.write(f, f"run/{f.name}")
        url = f"zip://run::file://{tmp_path / 'run.zip'}"
        r = run_cli("analyze", url, "--json", "--scheduler", address)
        assert r.returncode == 0, r.stderr
        via_url = _strip(json.loads(r.stdout))
        assert via_url["source"]["files"][0] == f"zip://run/rank0.trace.json.gz::file://{tmp_path / 'run.zip'}"
        assert via_url["phases"] == _strip(analyze(d, jobs=1))["phases"]
        (tmp_path / "diesonce").mkdir()
        dies = _run(tmp_path / "diesonce")  # a worker dies mid-task: Dask reschedules it, same answer
        r = run_cli("analyze", str(dies), "--json", "--scheduler", address)
        assert r.returncode == 0, r.stderr
        assert _strip(json.loads(r.stdout))["ranks"] == _strip(analyze(dies, jobs=1))["ranks"]
        (tmp_path / "bad").mkdir()
        bad = _run(tmp_path / "bad", bad="not a trace")
        r = run_cli("analyze", str(bad), env={"COMMPROBE_DASK_SCHEDULER": address})
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "rank1.trace.json.gz" in lines[0], r.stderr
    finally:
        _stop(procs)


def test_unreachable_scheduler_is_one_line_within_10_s(tmp_path):
    import time

    pytest.importorskip("distributed", reason="dask[distributed] is not installed (pip install 'commprobe[cluster]')")
    t = time.monotonic()
    r = run_cli("analyze", str(_run(tmp_path)), "--scheduler", "tcp://127.0.0.1:9")
    assert time.monotonic() - t < 10.5  # includes the interpreter's start
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "cannot reach the Dask scheduler" in lines[0], r.stderr


def test_generated_rank_set_gives_its_truth(tmp_path):
    """bench/rankset.py's set: the straggler named, every rank's exposed allreduce, wait and
    transfer per call exactly as constructed."""
    import sys

    sys.path.insert(0, str(__import__("tests.conftest", fromlist=["ROOT"]).ROOT / "bench"))
    from rankset import generate

    info = generate(tmp_path / "set", ranks=6, mb_per_rank=0.5, straggler=4, steps=10)
    r = analyze(tmp_path / "set", jobs=2)
    assert r["collectives"]["straggler"] == 4 and r["collectives"]["matched_calls"] == 10
    for row in r["collectives"]["ranks"]:
        t = info["truth"][row["rank"]]
        assert row["wait_us"] == pytest.approx(10 * t["wait_us"]) and row["transfer_us"] == pytest.approx(10 * t["transfer_us"])
    for rk in r["ranks"]:
        p = rk["phases"]["step"]
        assert p["windows"] == 10
        assert p["categories"]["tp_allreduce"]["exposed_us"] == pytest.approx(10 * info["truth"][rk["rank"]]["exposed_tp_us"])


def test_without_dask_the_flag_says_so_in_one_line(tmp_path, monkeypatch):
    """No dask installed: --scheduler is one line naming the extra, exit 2 (simulated by hiding it)."""
    import sys

    from commprobe.analyzers.readers.model import TraceError

    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # `from dask.distributed import` now fails
    with pytest.raises(TraceError, match=r"pip install 'commprobe\[cluster\]'"):
        analyze(_run(tmp_path), scheduler="tcp://127.0.0.1:9")


def test_a_pool_worker_that_dies_is_retried_once_then_named(tmp_path):
    d = _run(tmp_path)
    want = _strip(json.loads(run_cli("analyze", str(d), "--json", "--jobs", "1").stdout))
    r = run_cli("analyze", str(d), "--json", "--jobs", "2", env={"COMMPROBE_FAULT": f"map-die-once:{d}/rank2"})
    assert r.returncode == 0, r.stderr
    assert _strip(json.loads(r.stdout)) == want  # the retry gave the same answer
    r = run_cli("analyze", str(d), "--jobs", "2", env={"COMMPROBE_FAULT": f"map-die:{d}/rank2"})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "rank2.trace.json.gz" in lines[0] and "died twice" in lines[0], \
        r.stderr


def test_ctrl_c_leaves_no_worker_behind(tmp_path):
    """Ctrl-C reaches the whole foreground process group: the command and its pool workers (here
    hung on purpose) all end, exit 130, nothing left running."""
    import os
    import signal
    import subprocess
    import sys
    import time

    d = _run(tmp_path)
    p = subprocess.Popen([sys.executable, "-m", "commprobe.probe.cli", "analyze", str(d), "--jobs", "2"],
                         env={**os.environ, "COMMPROBE_FAULT": "map-hang"}, start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         # as from a terminal: a test runner started in the background inherits SIGINT ignored
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def group() -> list[int]:
        pids = []
        for e in os.listdir("/proc"):
            if e.isdigit():
                try:
                    if os.getpgid(int(e)) == p.pid:
                        pids.append(int(e))
                except ProcessLookupError:
                    pass
        return pids

    try:
        deadline = time.monotonic() + 60
        while len(group()) < 3 and time.monotonic() < deadline:  # the command and its two workers
            time.sleep(0.1)
        assert len(group()) >= 3, "the pool did not start"
        time.sleep(0.5)
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
        deadline = time.monotonic() + 10
        while group() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not group(), f"left running: {group()}"
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_worker_that_forbids_malloc_reuse_gets_the_same_summary(tmp_path, monkeypatch):
    """Dask's nanny sets MALLOC_TRIM_THRESHOLD_ in its workers; the map raises glibc's thresholds for
    a task's duration (two tasks at once in one worker: restored after the last) and the answer
    does not change."""
    import threading

    from commprobe.analyzers.cross_rank import rank_map as ranks

    d = _run(tmp_path)
    plain = [ranks.summarize(f)[0].breakdown for f in sorted(d.iterdir())]
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    out = {}
    threads = [threading.Thread(target=lambda f=f: out.__setitem__(f.name, ranks.summarize(f)[0].breakdown))
               for f in sorted(d.iterdir())]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [out[f.name] for f in sorted(d.iterdir())] == plain
    assert ranks._malloc_users == 0
