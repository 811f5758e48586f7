"""The command line as a user meets it: real subprocesses, exit codes, one-line errors."""

import os

import pytest

from commprobe.reference_impl.checkpoint import save_hf
from commprobe.reference_impl.config import get_preset
from commprobe.reference_impl.model import build_model
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
    (["--preset", "tiny", "--backend", "gloo,gloo"], "lists a backend twice"),
])
def test_bad_arguments_give_one_line_and_exit_2(args, needle, tmp_path):
    r = run_cli("profile", *args, "--out", str(tmp_path / "run"))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr


@pytest.mark.skipif((os.cpu_count() or 1) >= 4, reason="needs a host with fewer than 4 cores")
def test_oversubscription_needs_flag(tmp_path):
    r = run_cli("profile", "--preset", "tiny", "--tp", "4", "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and "--oversubscribe" in r.stderr


def test_profile_prints_latency_table_from_checkpoint(tmp_path):
    save_hf(build_model(get_preset("tiny"), seed=2), tmp_path / "ckpt")
    r = run_cli("profile", "--checkpoint", str(tmp_path / "ckpt"), "--tp", "2", "--steps", "3",
                "--prompt-len", "16", "--repeats", "1", "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    for col in ("TTFT ms", "TTIT ms", "p90 ms", "tok/s"):
        assert col in r.stdout
    assert r.stdout.count("│    0 │") == 1 and r.stdout.count("│    1 │") == 1


def test_profile_with_two_backends_gives_the_same_tokens(tmp_path):
    r = run_cli("profile", "--preset", "tiny", "--steps", "4", "--repeats", "1", "--backend", "gloo,dda",
                "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    assert "backend gloo" in r.stdout and "backend dda" in r.stdout
    # a first run ends in the run's verdict and what to run next (the way git says what to do)
    import json

    lines = r.stdout.splitlines()
    verdict = [ln.split() for ln in lines[lines.index("verdict:") + 1:lines.index("next:")]]
    assert [(v[0], v[1]) for v in verdict] == [("gloo", "prefill"), ("gloo", "decode"), ("dda", "prefill"), ("dda", "decode")]
    analysis = json.loads(run_cli("analyze", str(tmp_path / "run" / "dda"), "--json").stdout)
    assert verdict[3][2] == analysis["phases"]["decode"]["verdict"]  # the same verdict `analyze` gives
    after = "\n".join(lines[lines.index("next:"):])
    run = str(tmp_path / "run")
    assert f"commprobe analyze {run}/gloo" in after and f"commprobe report {run}" in after
    assert f"commprobe compare {run}/gloo {run}/dda" in after


@pytest.mark.parametrize("columns", ["100", "80"])
def test_analyze_tables_cut_no_number_at_100_and_80_columns(real_traces, columns):
    """A person reads the terminal tables: at 100 and 80 columns no cell is cut ('…'), and every
    rank's e2e per window appears whole."""
    import json

    for inp in (real_traces / "facebookresearch-param", real_traces / "hta" / "nccl_parser_config_nccl_data.json.gz"):
        r = run_cli("analyze", str(inp), "--jobs", "1", env={"COLUMNS": columns})
        assert r.returncode == 0, r.stderr
        assert "…" not in r.stdout, r.stdout
        assert max(len(line) for line in r.stdout.splitlines()) <= int(columns)
        a = json.loads(run_cli("analyze", str(inp), "--jobs", "1", "--json").stdout)
        ms = max(p["e2e_us"] / p["windows"] for rk in a["ranks"] for p in rk["phases"].values()) >= 10_000
        for rk in a["ranks"]:
            for p in rk["phases"].values():
                e2e = p["e2e_us"] / p["windows"]
                assert (f"{e2e / 1000:.1f}" if ms else f"{e2e:.0f}") in r.stdout


def test_next_steps_fit_what_was_read():
    """After a server capture the next steps are its own (analyze, report, compare two captures),
    not a profile of commprobe's reference model."""
    from rich.console import Console

    from commprobe.reports.terminal import render_next_steps

    def said(source: str) -> str:
        c = Console(record=True, width=200)
        render_next_steps("runs/cap", {"vllm": {}}, c, source=source)
        return c.export_text()

    assert "commprobe profile" not in said("capture") and "commprobe report runs/cap AFTER" in said("capture")
    assert "commprobe profile --backend gloo,dda" in said("profile")
