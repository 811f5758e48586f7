"""A real vLLM engine for the tests: the venv (tests/vllm_venv.sh, built once outside the clone), a
tiny random model (tests/tiny_llama.py), and an OpenAI-compatible server on 127.0.0.1 with vLLM's
own torch profiler, started and stopped here (its whole process group), bounded in time. Shared by
tests/test_vllm_engine.py (a Llama) and tests/test_vllm_moe.py (a Mixtral)."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import ROOT


def post(url: str, body: dict | None = None, timeout: float = 120) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


def complete(trace: Path) -> bool:
    """Whether a gzip trace is whole (workers go on writing after /stop_profile returns)."""
    try:
        with gzip.open(trace) as f:
            while f.read(1 << 22):
                pass
        return True
    except (OSError, EOFError):
        return False


def raw(trace: Path) -> list[dict]:
    return [e for e in json.load(gzip.open(trace))["traceEvents"] if e.get("ph") == "X"]


def union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


STEP = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$")  # gpu_worker.py annotate_profile


def steps_by_phase(events: list[dict]) -> tuple[dict[str, int], list[tuple[float, float]]]:
    """Truth from the raw events: the engine's steps per phase (context only: prefill; generation
    only: decode; both: mixed) and every step's span."""
    steps: dict[str, int] = {}
    windows = []
    for e in events:
        m = STEP.match(e["name"])
        if m:
            ctx, gen = int(m.group(1)), int(m.group(3))
            ph = "mixed" if ctx and gen else "prefill" if ctx else "decode" if gen else "idle-step"
            steps[ph] = steps.get(ph, 0) + 1
            windows.append((e["ts"], e["ts"] + e["dur"]))
    return steps, windows


def allreduce_in_steps(events: list[dict], windows: list[tuple[float, float]]) -> float:
    """µs of vLLM's CPU TP allreduce (`_C::shm_allreduce`) inside the step spans, as a union."""
    ar = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == "_C::shm_allreduce"]
    assert ar, "no _C::shm_allreduce in a TP=2 vLLM CPU trace"
    return union([(max(a, wa), min(b, wb)) for a, b in ar for wa, wb in windows if a < wb and b > wa])


def venv_python() -> str:
    """The vLLM venv's python, built if need be; skips the calling test with one line where it cannot be."""
    try:
        r = subprocess.run(["bash", str(ROOT / "tests" / "vllm_venv.sh")], capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        pytest.skip("the vLLM venv could not be built here within 15 min")
    if r.returncode != 0:
        pytest.skip(f"the vLLM venv could not be built here: {r.stderr.strip()[-200:]}")
    return r.stdout.strip().splitlines()[-1]


@contextmanager
def serve(python: str, tmp: Path, moe: bool = False):
    """A real vLLM server (TP=2, chunked prefill in 16-token chunks, its profiler writing to
    tmp/profile) on a tiny random model; yields {base, model, prof, log}."""
    model, prof = tmp / "tiny", tmp / "profile"
    prof.mkdir()
    subprocess.run([python, str(ROOT / "tests" / "tiny_llama.py"), str(model), *(["--moe"] if moe else [])], check=True,
                   capture_output=True, timeout=300)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = {"profiler": "torch", "torch_profiler_dir": str(prof), "torch_profiler_with_stack": False,
           "torch_profiler_record_shapes": True}  # message sizes (headroom at its sizes)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    log = open(tmp / "server.log", "w")
    server = subprocess.Popen(
        [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--tensor-parallel-size", "2",
         "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "256", "--dtype", "float32", "--enforce-eager",
         "--enable-chunked-prefill", "--max-num-batched-tokens", "16", "--profiler-config", json.dumps(cfg)],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"{base}/version", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("vLLM server did not start: " + (tmp / "server.log").read_text()[-2000:])
                time.sleep(2)
        yield {"base": base, "model": model, "prof": prof, "log": tmp / "server.log"}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
        log.close()


def wait_for_traces(prof: Path, pattern: str, n: int, timeout: float = 300) -> list[Path]:
    """The n worker traces matching `pattern`, once each is complete."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(prof.glob(pattern))
        if len(found) == n and all(complete(p) for p in found):
            return found
        time.sleep(2)
    pytest.fail(f"the workers' traces did not appear complete in {prof}")
