"""NCCL RAS status read into `commprobe hang`'s findings (issue 59, item 3), on the real output NCCL's
own user guide quotes (tests/data/nccl_ras/README.md), from a file or asked of its port."""

from __future__ import annotations

import json
import socket
import threading

from tests.conftest import ROOT, assert_one_line_exit_2, run_cli

DATA = ROOT / "tests" / "data" / "nccl_ras"


def _hang(*args):
    r = run_cli("hang", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_guides_samples_read_as_findings():
    assert _hang(str(DATA / "healthy.txt"))["findings"] == []
    f = _hang(str(DATA / "count_mismatch.txt"))["findings"]
    assert [x["kind"] for x in f] == ["count_mismatch"]
    assert f[0]["missing"] == [0, 2, 3, 4, 5, 7] and "operation 6649, others up to 6650" in f[0]["summary"]
    assert "process 483072 on node 172.16.64.210" in f[0]["summary"] and "one snapshot" in f[0]["summary"]
    inc = _hang(str(DATA / "incomplete.txt"))
    assert [x["kind"] for x in inc["findings"]] == ["process_unresponsive", "missing_rank"]
    assert inc["findings"][1]["missing"] == [21] and "cf264af53edbe986" in inc["findings"][1]["group"]
    assert "process 3487984 on node 172.16.64.213" in inc["findings"][0]["summary"] and "2 communication" in inc["notes"][0]
    dead = _hang(str(DATA / "dead.txt"))["findings"]
    assert [x["kind"] for x in dead] == ["process_dead", "missing_rank"] and dead[1]["missing"] == [21]
    fin = _hang(str(DATA / "finalize_status.txt"))["findings"]
    assert [x["kind"] for x in fin] == ["status_mismatch"] and "2 FINALIZE" in fin[0]["summary"]
    js = _hang(str(DATA / "missing_rank.json"))["findings"]
    assert js[0]["kind"] == "missing_rank" and js[0]["missing"] == [1] and "process 1524345" in js[0]["summary"]
    text = run_cli("hang", str(DATA / "incomplete.txt"))
    assert text.returncode == 0 and text.stdout.startswith("root cause (process_unresponsive)")


def _ras_server(answers: list[bytes], hello: bytes = b"SERVER PROTOCOL 2\n") -> int:
    """A RAS port on 127.0.0.1 that answers each STATUS with the next of `answers`."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    left = list(answers)

    def run():
        while left:
            c, _ = srv.accept()
            with c:
                c.recv(4096)
                c.sendall(hello)
                c.recv(4096)
                c.sendall(left.pop(0))
        srv.close()

    threading.Thread(target=run, daemon=True).start()
    return srv.getsockname()[1]


def test_two_queries_tell_stuck_from_moving():
    frozen = (DATA / "count_mismatch.txt").read_bytes()
    port = _ras_server([frozen, frozen])
    f = _hang("--ras", f"127.0.0.1:{port}", "--interval", "0.2")["findings"][0]
    assert f["moving"] is False and "stuck" in f["summary"] and f["cause"] == "host"
    later = frozen.replace(b"6650", b"6710").replace(b"6649", b"6709")
    port = _ras_server([frozen, later])
    f = _hang("--ras", f"127.0.0.1:{port}", "--interval", "0.2")["findings"][0]
    assert f["moving"] is True and "in flight" in f["summary"]


def test_bad_ras_targets_are_one_line(tmp_path):
    assert_one_line_exit_2(run_cli("hang", "--ras", "10.1.1.1:28028"), "127.0.0.1:PORT only")
    port = _ras_server([b"x"], hello=b"HTTP/1.1 200 OK\r\n\r\n")
    assert_one_line_exit_2(run_cli("hang", "--ras", f"127.0.0.1:{port}"), "not NCCL RAS")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    free = s.getsockname()[1]
    s.close()
    assert_one_line_exit_2(run_cli("hang", "--ras", f"127.0.0.1:{free}"), "NCCL_RAS_ENABLE")
    bad = tmp_path / "bad.json"
    bad.write_text('{"nccl_version": "2.29", "communicators": 5}')
    assert_one_line_exit_2(run_cli("hang", str(bad)), "without a communicators list")
