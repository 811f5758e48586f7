"""One --what-if parser for every prediction (issue 58, item 1): common/whatif_spec.py returns typed
switches; the trace what-if, the layout what-if and the plan's alternatives all read through it."""

from __future__ import annotations

import pytest

from commprobe.common import whatif_spec as ws
from tests.conftest import ROOT


def test_kinds_and_values():
    assert [(s.key, s.kind, s.values) for s in ws.parse("backend=dda")] == [("backend", "backend", ("dda",))]
    assert ws.from_trace("allreduce=dda").kind == "op"
    assert ws.from_trace("tp=4") == ws.Switch("tp", ("4",)) and ws.from_trace("tp=4").kind == "layout"
    assert ws.for_model("allreduce=dda|x0.5, all_to_all=overlap, tp=4,8,16") == {
        "allreduce": ["dda", "x0.5"], "all_to_all": ["overlap"], "tp": ["4", "8", "16"]}


@pytest.mark.parametrize("spec,words", [("warp=9", "not key=value"), ("backend=dda|gloo", "one switch"),
                                        ("tp=x", "whole number"), ("tp=0", ">= 1"), ("tp=2, tp=4", "given twice"),
                                        ("batch=4", "model alternative"), ("", "empty")])
def test_bad_specs_are_one_line(spec, words):
    with pytest.raises(ws.WhatIfError, match=words):
        ws.from_trace(spec)


def test_a_trace_switch_is_not_a_model_alternative():
    with pytest.raises(ws.WhatIfError, match="plan --from"):
        ws.for_model("backend=dda")


def test_no_other_module_parses_a_what_if_spec():
    """The three former parsers delegate: none splits a spec itself."""
    for rel in ("analyzers/whatif.py", "plan/whatif.py", "plan/fromtrace.py", "probe/cli_plan.py"):
        src = (ROOT / rel).read_text()
        assert 'partition("=")' not in src and "re.split" not in src, rel


def test_one_calibration_reader(tmp_path):
    """analyzers/calibration.py reads every calibration file, for the analysis and the planner alike:
    collective rows checked, time-sharing rows kept for the planner, anything else one line."""
    import json

    from commprobe.analyzers import calibration as cal

    f = tmp_path / "sweep.json"
    f.write_text(json.dumps([{"backend": "gloo", "op": "allreduce", "bytes": 256, "world": 2, "time_us": 30.0},
                             {"bench": "time-sharing", "backend": "dda", "work_bytes": 1024, "world": 4, "cores": 2,
                              "interval_us": 500.0, "extra_us": 12.0},
                             {"backend": "gloo", "op": "allreduce", "bytes": "many", "time_us": 1.0}]))
    doc = cal.read_json(f)
    assert [r["bytes"] for r in cal.sweep_rows(doc, f)] == [256]
    assert [r["extra_us"] for r in cal.time_sharing_rows(doc)] == [12.0]
    assert cal.paths_of("a.json,b") == ["a.json", "b"] and cal.paths_of(["a,b", "c"]) == ["a", "b", "c"]
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(cal.CalibrationError, match="not a calibration file"):
        cal.read_json(tmp_path / "bad.json")
    for rel in ("analyzers/cross_rank/cause.py", "plan/calibrate.py", "plan/fromtrace.py"):
        src = (ROOT / rel).read_text()
        assert "json.loads" not in src and 'split(",")' not in src, rel
