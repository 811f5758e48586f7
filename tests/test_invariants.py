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
    assert invariants.check(analyze(path), path) == []


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
