"""`commprobe hang --live` on a real running job (issue 59): a 3-rank gloo job under torchrun whose
ranks serve their Flight Recorder records and stacks on unix sockets (tests/live_job.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import ROOT, assert_one_line_exit_2, run_cli

JOB = ROOT / "tests" / "live_job.py"


def _line(marker: str) -> int:
    return next(i for i, ln in enumerate(JOB.read_text().splitlines(), 1) if marker in ln)


@contextmanager
def _job(env: dict):
    """The job running: its socket directory once every rank serves; stopped on the way out, also
    when it fails to start."""
    d = Path(tempfile.mkdtemp(prefix="cp-live-"))  # short: a socket path is limited to 107 bytes
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                          str(JOB)], env={**os.environ, "LIVE_DIR": str(d), "OMP_NUM_THREADS": "1", **env},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(d.glob("*.sock"))) < 3:
            assert p.poll() is None and time.monotonic() < deadline, "the job did not start"
            time.sleep(0.2)
        time.sleep(1.5)  # a few collectives in
        yield d
    finally:
        _stop(p)


def _stop(p) -> None:
    """torchrun stops its workers on SIGTERM (they run in sessions of their own, out of reach of a
    signal to torchrun's group); SIGKILL after."""
    import signal

    p.terminate()
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)
    for pid in _workers():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _workers() -> list[int]:
    """Processes still running tests/live_job.py (none should outlive a test)."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(JOB).encode() in (proc / "cmdline").read_bytes():
                    out.append(int(proc.name))
            except OSError:
                continue
    return out


def _live(d, *extra):
    t = time.monotonic()
    r = run_cli("hang", "--live", str(d), "--json", *extra, timeout=60)
    return r, json.loads(r.stdout) if r.stdout.strip() else None, time.monotonic() - t


def test_a_rank_asleep_before_a_collective_is_named_now_with_its_stack():
    with _job({"SLEEPER": "1"}) as d:
        r, doc, took = _live(d)
    assert doc is not None, r.stderr
    assert doc["state"] == "hang" and took < 10, (doc, took)  # long before any timeout (gloo's: 30 min)
    f = doc["findings"][0]
    assert f["kind"] == "missing_rank" and f["missing"] == [1] and f["concerned"] == [0, 2] and f["seq"] == 3
    # where each rank is, from its own live stack: the sleeper at its sleep, the others at the collective
    assert doc["stacks"]["1"].endswith(f"live_job.py:{_line('THE SLEEP')} in <module>")
    for r_ in ("0", "2"):
        assert doc["stacks"][r_].endswith(f"live_job.py:{_line('THE COLLECTIVE')} in <module>")
    assert doc["progress"]["1"]["0"] == [2, 2] and doc["progress"]["0"]["0"] == [3, 2]
    assert r.returncode == 1


def test_a_slow_rank_is_a_straggler_not_a_hang_and_a_healthy_job_has_no_finding():
    with _job({"SLOW": "2"}) as d:
        r, doc, _ = _live(d)
    assert doc["state"] == "straggler" and doc["straggler"]["rank"] == 2, doc
    assert doc["findings"][0]["kind"] == "straggler" and "not a hang" in doc["findings"][0]["summary"]
    with _job({}) as d:
        r, doc, _ = _live(d)
        text = run_cli("hang", "--live", str(d), timeout=60)
    assert doc["state"] == "running" and doc["findings"] == [] and r.returncode == 0, doc
    assert text.stdout.startswith("running: no finding")


def test_a_rank_that_does_not_answer_is_named_and_the_answer_is_partial(tmp_path):
    with _job({"SLEEPER": "1"}) as d:
        dead = d / "rank-3.sock"  # a socket left by a process that is gone: nobody listens on it
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(dead))
        s.close()
        r, doc, _ = _live(d)
    assert doc["partial"] and "connection refused" in doc["unanswered"]["3"] and doc["ranks"] == [0, 1, 2]
    assert doc["state"] == "hang" and any("partial" in n for n in doc["notes"])


def test_no_endpoint_and_dead_sockets_are_one_line(tmp_path):
    assert_one_line_exit_2(run_cli("hang", "--live", str(tmp_path)), "no sockets")
    assert_one_line_exit_2(run_cli("hang", "--live", str(tmp_path / "nothing.sock")), "neither a socket")
    assert_one_line_exit_2(run_cli("hang", "--live", "10.0.0.1:29500"), "neither a socket")
    d = Path(tempfile.mkdtemp(prefix="cp-dead-"))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(d / "rank-0.sock"))
    s.close()
    assert_one_line_exit_2(run_cli("hang", "--live", str(d)), "connection refused")


def _server(path: Path, answer) -> threading.Thread:
    """A hostile endpoint: accepts, reads the request, then does what `answer` says."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(8)

    def run():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.recv(65536)
            try:
                answer(c)
            except OSError:
                pass
            finally:
                c.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("kind,words", [
    ("huge", "over 64 MB"), ("slow", "before the deadline"), ("garbage", "not an HTTP answer"),
    ("pickle", "not JSON"), ("status", "HTTP 500"), ("short", "cut short"), ("nested", "not JSON")])
def test_hostile_answers_are_one_line_and_never_executed(tmp_path, kind, words):
    import pickle

    marker = tmp_path / "executed"
    payload = b"cos\\nsystem\\n(S'touch " + str(marker).encode() + b"'\\ntR."  # a pickle that runs a command

    def answer(c):
        if kind == "huge":
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n")
            chunk = b"x" * (1 << 20)
            for _ in range(80):
                c.sendall(chunk)
        elif kind == "slow":
            time.sleep(8)
        elif kind == "garbage":
            c.sendall(b"\x00\xff" * 100)
        elif kind == "pickle":
            body = pickle.dumps({"entries": []}) + payload
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        elif kind == "status":
            c.sendall(b"HTTP/1.1 500 Internal\r\nContent-Length: 0\r\n\r\n")
        elif kind == "short":
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}")
        elif kind == "nested":
            body = b"[" * 100000 + b"]" * 100000
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    d = Path(tempfile.mkdtemp(prefix="cp-bad-"))
    _server(d / "rank-0.sock", answer)
    r = run_cli("hang", "--live", str(d), "--timeout", "2", "--interval", "0.2", timeout=60)
    assert_one_line_exit_2(r, words)
    assert not marker.exists()


def test_our_own_ranks_answer_while_a_profile_runs(tmp_path):
    """`profile` ranks serve their records and stacks (probe/forensics.serve) and the run directory
    says where (live.json) while it runs; the sockets and live.json are gone once it ends (here by
    Ctrl-C)."""
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "commprobe.probe.cli", "profile", "--preset", "tiny", "--tp", "2",
                          "--steps", "200", "--prompt-len", "16", "--repeats", "20", "--backend", "gloo",
                          "--out", str(out)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         # Ctrl-C acts as from a terminal even when the suite runs as a background job
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not (out / "live.json").is_file():
            assert p.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        socks = json.loads((out / "live.json").read_text())["sockets"]
        while not all(Path(s).exists() for s in socks.values()):  # each rank serves once it has started
            assert p.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(5)  # past start-up, where rank 0 (writing the manifest, starting the profiler) lags
        seen = []
        while "running" not in seen and p.poll() is None:  # the profiler's export is a quiet spell
            r, doc, _ = _live(out)
            seen.append(doc["state"])
        assert "running" in seen and "hang" not in seen and doc["ranks"] == [0, 1], (seen, doc)
        assert all(doc["stacks"][str(k)] for k in (0, 1))
        assert all(os.stat(s).st_mode & 0o077 == 0 for s in socks.values())  # the user's own
    finally:
        p.send_signal(signal.SIGINT)  # Ctrl-C: the launcher still takes its sockets down
        p.wait(120)
    assert not (out / "live.json").exists()
    assert not any(Path(s).exists() for s in socks.values())
