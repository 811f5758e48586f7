"""The invariants of bench/invariants.py hold on every real input the repository ships, and they do
catch a broken result (each check is shown to fire on a result altered to break it)."""

from __future__ import annotations

import copy
import importlib.util

import pytest

from commprobe.analyzers.analysis import analyze
from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("invariants", ROOT / "bench" / "invariants.py")
invariants = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(invariants)  # its real_inputs() and check(), as bench/invariants.py runs them


@pytest.mark.usefixtures("real_traces")
@pytest.mark.parametrize("path", invariants.real_inputs(), ids=lambda p: p.name)
def test_invariants_hold_on_every_real_input(path):
    assert invariants.check_all(path) == []


def test_the_wait_invariants_fire_on_a_straggler_named_against_its_waits(real_traces):
    """check_waits holds the last arriver, the waits and the straggler to one time source, call by
    call; each check fires on results altered to break it (the real DLRM set: 8 ranks, NCCL)."""
    from commprobe.analyzers.analysis import analyze_with_calls

    path = real_traces / "facebookresearch-param"
    result, red = analyze_with_calls(path)
    calls, waits = red.calls, red.waits
    assert invariants.check_waits(result, calls, waits) == []

    def broken(edit_result=None, edit_waits=None) -> list[str]:
        a, w = copy.deepcopy(result), copy.deepcopy(waits)
        if edit_result:
            edit_result(a)
        if edit_waits:
            edit_waits(w)
        return invariants.check_waits(a, calls, w)

    r0 = min(waits)
    j = int(next(i for i, last in enumerate(waits[r0][2]) if last >= 0 and last != r0))
    other = int(waits[r0][2][j])

    def name_self_last(w):  # rank r0 named last at a call it entered before the last arriver
        w[r0][2][j] = r0

    assert any("named last" in b or "after rank" in b or "times_last" in b for b in broken(edit_waits=name_self_last))

    def wrong_wait(w):
        w[r0][0][j] += 50.0

    assert any("its time beyond the last arriver's" in b for b in broken(edit_waits=wrong_wait))
    assert any("times_last" in b for b in broken(lambda a: a["collectives"]["ranks"][0].update(times_last=10 ** 6)))
    top = max(result["collectives"]["ranks"], key=lambda r: r["caused_wait_us"])
    low = next(r["rank"] for r in result["collectives"]["ranks"] if r["caused_wait_us"] < top["caused_wait_us"])
    assert any("straggler rank" in b for b in broken(lambda a: a["collectives"].update(straggler=low)))
    assert any("names no arrival rule" in b for b in broken(lambda a: a["collectives"].pop("arrival_rule")))
    assert any("against the rule" in b for b in broken(lambda a: a["collectives"].update(straggler=None)))

    def on_two_hosts(a):  # a start-time reading of ranks whose identities name two hosts
        a["ranks"][0]["identity"]["host"], a["ranks"][1]["identity"]["host"] = "nodea", "nodeb"

    assert any("start times on 2 hosts' clocks" in b for b in broken(on_two_hosts))
    assert other != r0


def test_the_invariants_fire_on_broken_results(real_traces):
    path = real_traces / "hta" / "nccl_parser_config_nccl_data.json.gz"
    good = analyze(path)
    assert invariants.check(good, path) == []

    def broken(edit) -> list[str]:
        a = copy.deepcopy(good)
        edit(a)
        return invariants.check(a, path)

    rank, phase = good["ranks"][0], next(iter(good["phases"]))
    ph = next(iter(rank["phases"]))
    assert any("time unaccounted" in b for b in broken(lambda a: a["ranks"][0]["phases"][ph].update(idle_us=0.0)))
    assert any("communication-bound at" in b for b in broken(lambda a: a["phases"][phase].update(
        verdict="communication-bound", exposed_comm_share=0.0)))
    assert any("'largest' is" in b for b in broken(lambda a: a["phases"][phase].update(largest="memcpy")))
    assert any("names no rank rule" in b for b in broken(lambda a: a["ranks"][0].pop("rank_rule")))
    assert any("counted from the raw events" in b for b in broken(
        lambda a: a["ranks"][0]["phase_rule"].update(busy_in_windows_pct=50.0)))
    assert any("without a reason" in b for b in broken(lambda a: a["phases"][phase].update(verdict="unknown", notes=[])))
