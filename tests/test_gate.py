"""The regression gate: its statistics, a real injected slowdown caught, same-code runs passing,
bad input failing closed (exit 2), and its Markdown / JUnit / JSON outputs."""

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from commprobe.common.stats import mann_whitney_greater
from commprobe.gate import Metric, Thresholds, judge
from commprobe.gate.metrics import timing_metrics
from commprobe.probe.launch import launch
from commprobe.probe.run import RunConfig, run_rank
from tests.conftest import ROOT, run_cli

# The thresholds .ci/run gates with on this noisy 2-core machine (measured: bench/RESULTS.md).
CI_FLAGS = ["--max-regression", "150%", "--max-share-increase", "30pp"]
CI = Thresholds(max_regression=1.5, max_share_increase=0.30)
WORKLOAD = ["--preset", "tiny", "--tp", "2", "--steps", "8", "--repeats", "6", "--prompt-len", "16", "--backend", "dda"]


def test_mann_whitney_matches_the_textbook_case():
    lo, hi = [1, 2, 3, 4, 5], [6, 7, 8, 9, 10]
    # Exact one-sided p for complete separation at n = 5 + 5 is 1/252 = 0.004; the normal
    # approximation with continuity correction gives 0.006.
    assert 0.004 < mann_whitney_greater(hi, lo) < 0.007
    assert mann_whitney_greater(lo, hi) > 0.99
    assert mann_whitney_greater([3, 3, 3], [3, 3, 3]) == 1.0  # all ties: no evidence


def test_judge_needs_both_a_significant_shift_and_a_large_one():
    rng = np.random.default_rng(1)
    base = Metric("ttit_ms", "time", "ms", list(rng.normal(10, 0.5, 50)))

    def cur(scale):
        return Metric("ttit_ms", "time", "ms", list(rng.normal(10 * scale, 0.5 * scale, 50)))

    th = Thresholds(max_regression=0.10)
    assert judge("ttit_ms", base, cur(1.3), th).status == "regression"
    small = judge("ttit_ms", base, cur(1.05), th)  # significant but smaller than the effect size
    assert small.status == "pass" and small.p_value < 0.01
    assert judge("ttit_ms", base, cur(0.7), th).status == "improvement"
    few = judge("ttit_ms", base, Metric("ttit_ms", "time", "ms", [20.0] * 3), th)
    assert few.status == "unusable" and "too few samples" in few.why
    share = Metric("decode_comm_share/tp", "share", "fraction", list(rng.normal(0.10, 0.01, 40)))
    up = Metric("decode_comm_share/tp", "share", "fraction", list(rng.normal(0.18, 0.01, 40)))
    v = judge(share.name, share, up, Thresholds(max_share_increase=0.05))
    assert v.status == "regression" and 0.07 < v.change < 0.09


def _blocks(res, block: int, steps: int) -> list[dict]:
    """Cut each rank's repetitions into consecutive blocks, each a timings document of one 'run'."""
    n = len(res[0].timings["dda"].ttft_s) // block
    docs = []
    for i in range(n):
        ranks = []
        for r in res:
            t = r.timings["dda"]
            a, b = i * block, (i + 1) * block
            ranks.append({"samples": {
                "ttft_s": t.ttft_s[a:b], "ttit_s": t.ttit_s[a * steps:b * steps],
                "prefill_comm_s": {k: v[a:b] for k, v in t.prefill_comm_s.items()},
                "decode_comm_s": {k: v[a * steps:b * steps] for k, v in t.decode_comm_s.items()}}})
        docs.append({"ranks": ranks})
    return docs


def test_same_code_passes_at_least_19_of_20_comparisons():
    """40 consecutive 'runs' (blocks of 6 repetitions of the .ci/run workload) in one launch;
    20 disjoint pairs gated at the CI thresholds: at most one may fail on this noisy machine."""
    steps, block, pairs = 8, 6, 20
    cfg = RunConfig(preset="tiny", tp=2, decode_steps=steps, prompt_len=16, repeats=2 * pairs * block,
                    backends=["dda"], profile=False)
    res = launch(run_rank, 2, (cfg,), backend="gloo", timeout=600)
    docs = _blocks(res, block, steps)
    failed = []
    for k in range(pairs):
        base, cur = timing_metrics(docs[2 * k]), timing_metrics(docs[2 * k + 1])
        bad = [v for v in (judge(n, base[n], cur[n], CI) for n in base) if v.status != "pass" and v.status != "improvement"]
        if bad:
            failed.append(f"pair {k}: " + "; ".join(f"{v.name} {v.why}" for v in bad))
    assert len(failed) <= 1, "\n".join(failed)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three real bundles: a baseline, the same code again, and the same code with 1 ms slept
    inside every DDA allreduce (COMMPROBE_DDA_DELAY_US emulates a slower link): 4 allreduces per
    decode step of 0.5-1.1 ms, a slowdown well past this machine's run-to-run noise."""
    root = tmp_path_factory.mktemp("gate")
    out = {}
    for name, env in (("base", {}), ("same", {}), ("slow", {"COMMPROBE_DDA_DELAY_US": "1000"})):
        r = run_cli("profile", *WORKLOAD, "--out", str(root / name), env=env)
        assert r.returncode == 0, r.stderr
        out[name] = root / name
    b = run_cli("gate", "--update-baseline", "--current", str(out["base"]), "--baseline", str(root / "base.json"))
    assert b.returncode == 0, b.stderr
    out["baseline"] = root / "base.json"
    out["root"] = root
    return out


def test_injected_slowdown_is_caught_and_reported_in_every_format(runs):
    root = runs["root"]
    md, junit, js = root / "s.md", root / "s.xml", root / "s.json"
    r = run_cli("gate", "--baseline", str(runs["baseline"]), "--current", str(runs["slow"]), *CI_FLAGS,
                "--markdown", str(md), "--junit", str(junit), "--json", str(js))
    assert r.returncode == 1, r.stdout + r.stderr
    res = json.loads(js.read_text())
    assert res["status"] == "regression"
    status = {m["name"]: m for m in res["metrics"]}
    assert status["ttit_ms"]["status"] == "regression" and status["ttit_ms"]["change"] > 1.5  # + 4 ms per step
    assert status["decode_comm_share/tp"]["status"] == "regression"
    # from the traces, per decode window: the slowdown shows there too. A share is bounded by 1, so
    # where the machine is loaded (ranks descheduled wait for each other: the base run's share is
    # already high) the rise can fall under the 30 pp threshold (seen once in CI): it must still be
    # a clear rise, its whole 95 % interval above zero.
    ex = status["exposed_share/decode/tp"]
    assert ex["status"] == "regression" or (ex["change"] > 0.1 and ex["ci95"][0] > 0), ex
    assert "REGRESSION" in md.read_text() and "| `ttit_ms` |" in md.read_text()
    suite = ET.parse(junit).getroot()
    assert suite.tag == "testsuite" and int(suite.get("failures")) >= 2
    assert any(c.get("name") == "ttit_ms" and c.find("failure") is not None for c in suite.iter("testcase"))


def test_same_code_passes_and_baseline_records_the_machine(runs):
    r = run_cli("gate", "--baseline", str(runs["baseline"]), "--current", str(runs["same"]), *CI_FLAGS, "--json", "-")
    assert r.returncode == 0, r.stdout + r.stderr
    base = json.loads(runs["baseline"].read_text())
    assert base["schema"] == "commprobe.baseline/1" and base["machine"]["cpu_count"] > 0
    assert base["context"]["preset"] == "tiny" and base["context"]["world"]["tp"] == 2
    assert len(base["metrics"]["ttit_ms"]["samples"]) == 6 * 8


def test_a_baseline_pools_several_runs(runs, tmp_path):
    """--update-baseline with several --current runs keeps every run's samples (a baseline between
    this machine's fast and slow modes); it still catches the injected slowdown. Runs of another
    workload are refused (exit 2, one line), and the gate itself judges one run."""
    pooled = tmp_path / "pooled.json"
    r = run_cli("gate", "--update-baseline", "--current", str(runs["base"]), "--current", str(runs["same"]),
                "--baseline", str(pooled))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(pooled.read_text())
    one = json.loads(runs["baseline"].read_text())
    assert len(doc["metrics"]["ttit_ms"]["samples"]) == 2 * 6 * 8
    assert doc["metrics"]["ttit_ms"]["samples"][:6 * 8] == one["metrics"]["ttit_ms"]["samples"]
    assert doc["context"] == one["context"] and doc["machine"] == one["machine"]
    slow = run_cli("gate", "--baseline", str(pooled), "--current", str(runs["slow"]), *CI_FLAGS)
    assert slow.returncode == 1, slow.stdout + slow.stderr
    other = json.loads(runs["baseline"].read_text())
    other["context"]["prompt_len"] = 999
    (tmp_path / "other.json").write_text(json.dumps(other))
    bad = run_cli("gate", "--update-baseline", "--current", str(runs["base"]), "--current", str(tmp_path / "other.json"),
                  "--baseline", str(tmp_path / "x.json"))
    assert bad.returncode == 2 and "another workload" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "x.json").exists()
    two = run_cli("gate", "--baseline", str(pooled), "--current", str(runs["same"]), "--current", str(runs["slow"]))
    assert two.returncode == 2 and "one --current" in two.stderr


def test_baseline_from_another_machine_is_flagged(runs, tmp_path):
    base = json.loads(runs["baseline"].read_text())
    base["machine"]["processor"] = "Some Other CPU @ 9.9GHz"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(base))
    r = run_cli("gate", "--baseline", str(other), "--current", str(runs["same"]), *CI_FLAGS)
    assert "baseline from another machine" in r.stdout and "Some Other CPU" in r.stdout


def test_unusable_input_fails_closed_with_exit_2(runs, tmp_path):
    def gate(*args):
        return run_cli("gate", "--baseline", str(runs["baseline"]), *args)

    cases = {
        "missing metric": gate("--current", str(runs["same"]), "--metric", "nonexistent_ms"),
        "not a file": gate("--current", str(tmp_path / "nope")),
    }
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "commprobe.bundle/9"}')
    cases["wrong schema"] = gate("--current", str(bad))
    junk = tmp_path / "junk.json"
    junk.write_text("not json")
    cases["not json"] = gate("--current", str(junk))
    base = json.loads(runs["baseline"].read_text())
    base["context"]["prompt_len"] = 999
    other = tmp_path / "other.json"
    other.write_text(json.dumps(base))
    cases["other workload"] = run_cli("gate", "--baseline", str(other), "--current", str(runs["same"]))
    few = dict(base, context=json.loads(runs["baseline"].read_text())["context"])
    few["metrics"] = {"ttft_ms": {"kind": "time", "unit": "ms", "samples": [1.0, 2.0]}}
    fewp = tmp_path / "few.json"
    fewp.write_text(json.dumps(few))
    cases["too few samples"] = run_cli("gate", "--baseline", str(fewp), "--current", str(runs["same"]))
    dropped = json.loads(runs["baseline"].read_text())
    dropped["metrics"]["decode_comm_share/ep"] = {"kind": "share", "unit": "fraction", "samples": [0.1] * 10}
    dp = tmp_path / "dropped.json"
    dp.write_text(json.dumps(dropped))
    cases["metric gone from the current run"] = run_cli("gate", "--baseline", str(dp), "--current", str(runs["same"]))
    for what, r in cases.items():
        assert r.returncode == 2, f"{what}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        assert "Traceback" not in r.stderr, what


def test_a_regression_on_a_contended_host_is_unusable_and_says_why():
    """Real bundles (tests/data/runs/host-contention-tp2-dda): the same healthy job, quiet and beside
    one busy process. Against the quiet calibration the contended run's TTIT is 3x: not a regression
    of the code but of the host, which its telemetry shows (0.73 cores of other work): exit 2 with
    why. Where nothing regressed, the pass stands with a warning; a quiet run gets neither."""
    from commprobe.gate.decide import Thresholds, gate

    runs = ROOT / "tests" / "data" / "runs" / "host-contention-tp2-dda"
    res = gate(runs / "calibration", runs / "contended", ["ttit_ms"])
    assert res.exit_code == 2 and res.current_host["contended"], res.problems
    assert [v.status for v in res.metrics] == ["regression"]
    assert any("ttit_ms regressed" in p and "cannot be told from a contended host" in p for p in res.problems)
    assert res.to_dict()["current_host"]["other_cores"] == pytest.approx(res.current_host["other_cores"])
    lax = gate(runs / "calibration", runs / "contended", ["ttit_ms"], Thresholds(max_regression=10.0))
    assert lax.exit_code == 0 and any("other work took" in w for w in lax.warnings)
    quiet = gate(runs / "calibration", runs / "quiet", ["ttit_ms"])
    assert quiet.exit_code == 0 and quiet.current_host is None and not any("other work" in w for w in quiet.warnings)
