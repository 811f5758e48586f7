"""First contact, third round (issue 56), on real files: device work launched before the first
step is not the first step's (the real MI300X RCCL trace), checked against a reading of the raw
events written here, never against the analyzer."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from commprobe.analyzers.analysis import analyze
from tests.test_first_contact import invariant_violations

MI300X = "amd/kineto_mi300x_rccl_ddp_resnet_act_checkpoint.json.gz"


def _union(iv):
    out = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _minus(a, b):
    """Length of the union `a` not covered by the union `b`."""
    total = sum(y - x for x, y in a)
    for x, y in a:
        for u, v in b:
            total -= max(0.0, min(y, v) - max(x, u))
    return total


def _by_launch(path):
    """Per ProfilerStep (host range): its window from the first to the last device event whose runtime
    call lies inside the range (by correlation); and the communication kernels' time inside the
    windows that no compute kernel covers."""
    doc = json.load(gzip.open(path))
    ev = doc["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev
                   if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    launch = {e["args"]["correlation"]: e["ts"] for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")
              and "correlation" in e.get("args", {})}
    dev = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    wins = []
    for lo, hi in steps:
        mine = [e for e in dev if lo <= launch.get(e["args"].get("correlation"), -1) <= hi]
        wins.append((min(e["ts"] for e in mine), max(e["ts"] + e["dur"] for e in mine)))
    kern = [e for e in dev if e["cat"] == "kernel"]
    clip = [(max(a, lo), min(b, hi)) for e in kern if "nccl" in e["name"].lower()
            for lo, hi in wins for a, b in [(e["ts"], e["ts"] + e["dur"])] if min(b, hi) > max(a, lo)]
    compute = _union([(e["ts"], e["ts"] + e["dur"]) for e in kern if "nccl" not in e["name"].lower()])
    return [b - a for a, b in wins], _minus(_union(clip), compute)


def test_work_launched_before_the_first_step_is_not_in_it_on_the_real_mi300x_trace(real_traces):
    path = real_traces / MI300X
    truth, exposed = _by_launch(path)
    assert [round(w) for w in truth] == [18980, 18983, 18554]  # the folder's README, from the raw events
    a = analyze(path)
    rank = a["ranks"][0]
    got = sorted(b - a_ for a_, b in rank["windows"]["step"])
    assert got == pytest.approx(sorted(truth), rel=0.02)
    rule = rank["phase_rule"]
    assert rule["device_work_launched_before_the_trace"] == 968
    assert rule["device_work_before_first_step"]["events"] == 968
    p = a["phases"]["step"]
    assert p["e2e_us_max"] == pytest.approx(sum(truth), rel=0.02)
    assert p["exposed_comm_share"] * p["e2e_us_max"] == pytest.approx(exposed, rel=0.05)
    assert p["verdict"] == "communication-bound"
    assert invariant_violations(a, path) == []


def test_a_directory_of_traces_and_other_things_is_read_and_says_what_it_skipped(real_traces, tmp_path):
    """Beside two real ranks' traces: a job summary, a config list, a Flight Recorder dump's JSON
    form, a log, and JSON that is not even JSON. The traces are analyzed, each other JSON object named
    with why; what is not a JSON object (a cut trace, a list of numbers) is still refused in one line."""
    import shutil

    from tests.conftest import assert_one_line_exit_2, run_cli

    d = tmp_path / "run"
    d.mkdir()
    for r in (0, 1):
        shutil.copy(real_traces / "hta" / f"trace_filter_sampled_rank-{r}.json.gz", d)
    (d / "summary.json").write_text(json.dumps({"job": "x", "tp": 2, "ttft_ms": [310.2]}))
    (d / "nccl_trace_rank_0.json").write_text(json.dumps({"version": "2.9", "pg_config": {}, "entries": []}))
    (d / "train.log").write_text("step 1 done\n")
    with gzip.open(d / "config.json.gz", "wt") as f:
        json.dump({"model": "llama", "layers": 2}, f)
    a = analyze(d)
    assert [r["rank"] for r in a["ranks"]] == [0, 1]
    skipped = {Path(s["file"]).name: s["why"] for s in a["source"]["skipped"]}
    assert set(skipped) == {"summary.json", "nccl_trace_rank_0.json", "config.json.gz"}
    assert "commprobe hang" in skipped["nccl_trace_rank_0.json"]
    assert invariant_violations(a, d) == []
    (d / "cut.json").write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur"')
    assert_one_line_exit_2(run_cli("analyze", str(d)), "cut.json")
    only = tmp_path / "only"
    only.mkdir()
    (only / "summary.json").write_text(json.dumps({"job": "x"}))
    assert_one_line_exit_2(run_cli("analyze", str(only)), "none a trace")
