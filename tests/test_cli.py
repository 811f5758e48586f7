"""The command line as a user meets it: real subprocesses, exit codes, one-line errors."""

import os

import pytest

from reference_impl.checkpoint import save_hf
from reference_impl.config import get_preset
from reference_impl.model import build_model
from tests.conftest import run_cli


def test_help_lists_profile():
    r = run_cli("--help")
    assert r.returncode == 0 and "profile" in r.stdout


@pytest.mark.parametrize("args, needle", [
    (["--preset", "nope"], "unknown preset 'nope'"),
    (["--preset", "tiny", "--tp", "3"], "does not divide the 8 attention heads"),
    (["--preset", "tiny", "--steps", "0"], "--steps must be >= 1"),
    (["--preset", "tiny", "--backend", "mpi"], "unknown backend"),
    (["--checkpoint", "/nonexistent/dir"], "no config.json"),
])
def test_bad_arguments_give_one_line_and_exit_2(args, needle):
    r = run_cli("profile", *args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr


@pytest.mark.skipif((os.cpu_count() or 1) >= 4, reason="needs a host with fewer than 4 cores")
def test_oversubscription_needs_flag():
    r = run_cli("profile", "--preset", "tiny", "--tp", "4")
    assert r.returncode == 2 and "--oversubscribe" in r.stderr


def test_profile_prints_latency_table_from_checkpoint(tmp_path):
    save_hf(build_model(get_preset("tiny"), seed=2), tmp_path / "ckpt")
    r = run_cli("profile", "--checkpoint", str(tmp_path / "ckpt"), "--tp", "2", "--steps", "3",
                "--prompt-len", "16", "--repeats", "1")
    assert r.returncode == 0, r.stderr
    for col in ("TTFT ms", "TTIT median ms", "TTIT p90 ms", "tokens/s"):
        assert col in r.stdout
    assert r.stdout.count("│    0 │") == 1 and r.stdout.count("│    1 │") == 1


@pytest.mark.parametrize("fault, needle", [
    ("raise:1", "rank 1 failed: RuntimeError: injected fault on rank 1"),
    ("die:0", "rank 0 failed: exited with code 9"),
])
def test_failing_rank_is_named(fault, needle):
    r = run_cli("profile", "--preset", "tiny", "--steps", "2", "--repeats", "1", env={"COMMPROBE_TEST_FAULT": fault})
    assert r.returncode == 1
    assert needle in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_hanging_rank_is_timed_out():
    r = run_cli("profile", "--preset", "tiny", "--steps", "2", "--repeats", "1", "--timeout", "20",
                env={"COMMPROBE_TEST_FAULT": "hang:1"})
    assert r.returncode == 1
    assert "hung: still running after 20 s" in r.stderr and "1" in r.stderr, r.stderr


def test_profile_with_dda_backend_matches_gloo_tokens():
    args = ["profile", "--preset", "tiny", "--steps", "4", "--repeats", "1"]
    a, b = run_cli(*args, "--backend", "gloo"), run_cli(*args, "--backend", "dda")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert "backend dda" in b.stdout
