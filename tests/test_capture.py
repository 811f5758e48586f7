"""`commprobe capture` on bad input (the real-server test is in tests/test_vllm_engine.py): nothing
listening, a server without its profiler, a trace directory that stays empty — each one line and
exit 2, quickly. The stub servers here listen on 127.0.0.1 and are stopped by the test."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.conftest import assert_one_line_exit_2, run_cli
from tests.stub_server import serve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def stub(request, tmp_path):
    """tests/stub_server.py's server; request.param: the /start_profile status, or (status, mode)."""
    start, mode = request.param if isinstance(request.param, tuple) else (request.param, "")
    prof = tmp_path / "prof"
    prof.mkdir()
    server = serve(prof, start, mode)
    yield f"http://127.0.0.1:{server.server_address[1]}", prof, server.seen
    server.shutdown()


def test_nothing_listening_is_one_line_within_10_s(tmp_path):
    t = time.monotonic()
    r = run_cli("capture", f"http://127.0.0.1:{_free_port()}", "--trace-dir", str(tmp_path))
    assert_one_line_exit_2(r, "nothing is listening")
    assert time.monotonic() - t < 10


@pytest.mark.parametrize("stub", [404], indirect=True)
def test_a_server_without_its_profiler_names_the_flag(stub, tmp_path):
    r = run_cli("capture", stub[0], "--trace-dir", str(stub[1]))
    assert_one_line_exit_2(r, "start the server with its profiler on (--profiler-config")


@pytest.mark.parametrize("stub", [200], indirect=True)
def test_traces_that_never_appear_name_the_directory(stub, tmp_path):
    r = run_cli("capture", stub[0], "--trace-dir", str(stub[1]), "--requests", "2", "--timeout", "4",
                "--out", str(tmp_path / "out"))
    assert_one_line_exit_2(r, f"{stub[1]}: no complete worker trace appeared within 4 s")


@pytest.mark.parametrize("stub", [(200, "write")], indirect=True)
def test_a_trace_dir_named_by_an_fsspec_url(stub, tmp_path):
    """--trace-dir may be a URL (a remote host's shared storage): listed, checked and copied through
    fsspec; the capture's bundle analyzes with the worker's steps, the front end kept apart."""
    pytest.importorskip("fsspec", reason="fsspec is in the cluster extra")
    out = tmp_path / "cap"
    r = run_cli("capture", stub[0], "--trace-dir", stub[1].as_uri(), "--requests", "3", "--out", str(out), "--json",
                "--timeout", "30")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["capture"]["requests"] == 3 and doc["capture"]["failed"] == 0 and doc["capture"]["ttft_ms"] > 0
    assert sorted(p.name for p in out.glob("*.json.gz")) == ["rank0.1796396678045716358.pt.trace.json.gz",
                                                             "vm_1.async_llm.1796396678014338521.pt.trace.json.gz"]
    a = doc["analysis"]
    assert a["ranks"][0]["phase_rule"]["engine_steps"]["prefill"]["steps"] == 1 and len(a["source"]["skipped"]) == 1


@pytest.mark.parametrize("stub", [(200, "die")], indirect=True)
def test_a_server_that_dies_mid_capture_is_named_and_what_was_collected_kept(stub, tmp_path):
    out = tmp_path / "cap"
    r = run_cli("capture", stub[0], "--trace-dir", str(stub[1]), "--requests", "2", "--out", str(out),
                "--timeout", "3")
    assert_one_line_exit_2(r, "the server stopped answering during the capture")
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "failed" and len(m["requests"]) == 2 and m["error"]


@pytest.mark.parametrize("stub", [(200, "sglang-stopped")], indirect=True)
def test_a_server_whose_profiler_stopped_itself_still_gives_a_bundle(stub, tmp_path):
    """SGLang stops its profiler by itself (num_steps, or another client's batch ends it early) and
    /stop_profile then answers HTTP 500 "Profiling is not in progress": the traces written are
    collected and the client's timings kept (before: exit 2, no bundle). Each request's prompt starts
    with its own word, so no prefix cache turns a prefill into a one-token extend; SGLang is asked
    for no num_steps."""
    out = tmp_path / "cap"
    r = run_cli("capture", stub[0], "--trace-dir", str(stub[1]), "--requests", "3", "--out", str(out), "--json",
                "--timeout", "30")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["capture"]["requests"] == 3 and doc["capture"]["failed"] == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["engine"]["name"] == "sglang" and "already stopped" in m["profiler_stopped_by_server"]
    assert sorted(p.name for p in out.glob("*.trace.json.gz")) == ["1796569413.65-TP-0.trace.json.gz",
                                                                   "1796569413.65-TP-1.trace.json.gz"]
    assert m["prefill_tokens"] == {"sent": 3 * 32, "prefilled": 20, "served_from_cache": 76}  # the markers' toks
    assert doc["capture"]["prefill_tokens"] == m["prefill_tokens"]
    seen = stub[2]
    assert "num_steps" not in seen["start"]
    firsts = [p.split(" ")[0] for p in seen["prompts"]]
    assert len(set(firsts)) == 3 and len({len(p.split(" ")) for p in seen["prompts"]}) == 1
