"""`commprobe calibrate` and the interval every prediction carries (issue 58, items 2 and 3): the
rounds run alternated, the calibration is read by plan/analyze as its rounds' bundles, each round is
predicted from the others against its own measured run, and a prediction from it carries low/high."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import assert_one_line_exit_2, run_cli

JOB = ("--preset", "tiny", "--tp", "2", "--steps", "4", "--prompt-len", "8", "--repeats", "3",
       "--profiled-repeats", "1")


@pytest.fixture(scope="module")
def cal(tmp_path_factory):
    out = tmp_path_factory.mktemp("cal") / "cal"
    r = run_cli("calibrate", *JOB, "--backend", "gloo,dda", "--rounds", "3", "--out", str(out), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "3 of 3 rounds (ok)" in r.stdout and "gloo → dda" in r.stdout and "plan --from RUN" in r.stdout
    return out


def test_rounds_alternate_and_each_is_predicted_from_the_others(cal):
    from commprobe.common.bundle import unprofiled_medians

    doc = json.loads((cal / "calibration.json").read_text())
    assert doc["schema"] == "commprobe.calibration/1" and doc["status"] == "ok"
    assert [r["order"] for r in doc["rounds"]] == [["gloo", "dda"], ["dda", "gloo"], ["gloo", "dda"]]
    pairs = doc["cross_validation"]["pairs"]
    assert set(pairs) == {"gloo->dda", "dda->gloo"}
    for pair, by in pairs.items():
        rows = by["decode"]
        assert [r["round"] for r in rows] == [1, 2, 3]
        target = pair.split("->")[1]
        for r in rows:  # measured is the round's own run of the target, read from its bundle here
            assert r["measured_ms"] == pytest.approx(unprofiled_medians(cal / f"round-{r['round']:02d}" / target)["ttit"])
            assert r["error"] == pytest.approx(r["measured_ms"] / r["predicted_ms"])
        s = doc["cross_validation"]["summary"][pair]["decode"]
        lo, hi = s["relative_interval"]
        assert s["rounds"] == 3 and lo < hi and s["within_10pct"] == sum(abs(r["error"] - 1) <= 0.1 for r in rows)


def test_a_prediction_from_the_calibration_carries_its_interval(cal, tmp_path):
    src = cal / "round-01" / "gloo"
    r = run_cli("plan", "--from", str(src), "--what-if", "backend=dda", "--calibration", str(cal), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    dec = doc["phases"]["decode"]
    assert dec["low_ms"] < dec["high_ms"] and dec["interval"]["errors"] == 3 and dec["interval"]["level"] == 0.9
    # the interval is the cross-validated errors' log mean +- t(0.95, 2) sd sqrt(1 + 1/3), around the prediction
    errs = [x["error"] for x in json.loads((cal / "calibration.json").read_text())
            ["cross_validation"]["pairs"]["gloo->dda"]["decode"]]
    logs = [math.log(e) for e in errs]
    m = sum(logs) / 3
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / 2)
    half = 2.920 * sd * math.sqrt(4 / 3)
    assert dec["low_ms"] == pytest.approx(dec["predicted_ms"] * math.exp(m - half))
    assert dec["high_ms"] == pytest.approx(dec["predicted_ms"] * math.exp(m + half))
    text = run_cli("plan", "--from", str(src), "--what-if", "backend=dda", "--calibration", str(cal))
    assert text.returncode == 0 and "90% over 3 rounds" in text.stdout, text.stdout
    # one bundle as the calibration: no interval, and the prediction says why
    thin = run_cli("plan", "--from", str(src), "--what-if", "backend=dda", "--calibration", str(cal / "round-02"),
                   "--json")
    assert thin.returncode == 0, thin.stderr[-2000:]
    tdoc = json.loads(thin.stdout)
    assert tdoc["phases"]["decode"]["low_ms"] is None and any("too thin" in n for n in tdoc["notes"])
    # analyze reads the same calibration (its rounds' bundles)
    a = run_cli("analyze", str(src), "--calibration", str(cal), "--json")
    assert a.returncode == 0 and "dda" in json.loads(a.stdout)["headroom"]["backends"]


def test_bad_calibrations_are_one_line(tmp_path):
    r = run_cli("calibrate", *JOB, "--backend", "gloo", "--out", str(tmp_path / "x"))
    assert_one_line_exit_2(r, "two backends")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    assert_one_line_exit_2(run_cli("calibrate", *JOB, "--out", str(tmp_path / "full")), "not an empty directory")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "calibration.json").write_text(json.dumps({"schema": "commprobe.calibration/1", "rounds": []}))
    r = run_cli("analyze", "tests/data/traces/hta/trace_filter_sampled_rank-0.json.gz", "--calibration", str(bad))
    assert_one_line_exit_2(r, "no finished round")


def test_interval_math():
    from commprobe.plan.intervals import interval

    assert interval(10.0, [1.0, 1.0]) is None  # two errors are not a spread
    lo, hi = interval(10.0, [1.0, 1.0, 1.0])
    assert lo == hi == pytest.approx(10.0)
    lo, hi = interval(10.0, [0.9, 1.0, 1.1, 1.0, 1.0, 1.05, 0.95])
    assert lo < 10.0 < hi and math.log(hi / 10) == pytest.approx(-math.log(lo / 10), rel=0.1)  # log-symmetric
