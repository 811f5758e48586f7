"""An all-to-all is not always EP (issue: fidelity on real producers): sequence-parallel attention
(DeepSpeed-Ulysses, xDiT, FastVideo) exchanges heads and sequence with all-to-alls around
attention. Real two-rank gloo jobs under torch.profiler (tests/seqpar_job.py): attention between
the all-to-alls and nothing of experts is CP, inferred, with the reason in the result; the same
exchange around experts stays EP. The shapes are checked in the raw events first."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from commprobe.analyzers.analysis import analyze
from tests.conftest import ROOT


def _run(out, mode):
    out.mkdir()
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "seqpar_job.py"), str(r), str(out), mode],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    for p in procs:
        p.wait(timeout=120)
    assert all(p.returncode == 0 for p in procs), [p.stdout.read() for p in procs]
    return out


def _raw_order(trace):
    ev = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    keep = [e for e in ev if e["name"] in ("c10d::alltoall_base_", "aten::scaled_dot_product_attention", "moe_experts")]
    return [e["name"] for e in sorted(keep, key=lambda e: e["ts"])]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("seqpar")
    return {m: _run(root / m, m) for m in ("ulysses", "moe")}


def test_all_to_alls_around_attention_are_cp(runs):
    order = _raw_order(runs["ulysses"] / "rank0.pt.trace.json")
    assert order[:3] == ["c10d::alltoall_base_", "aten::scaled_dot_product_attention", "c10d::alltoall_base_"]
    r = analyze(runs["ulysses"])
    for rank in r["ranks"]:
        cats = rank["phases"]["trace"]["categories"]
        assert cats["cp_ring"]["total_us"] > 0 and cats["ep_all_to_all"]["total_us"] == 0
    assert set(r["axis_reasons"]) == {"rank 0", "rank 1"}
    assert "sequence-parallel attention" in r["axis_reasons"]["rank 0"]
    assert r["axis_provenance"]["cp_ring"] == {"inferred": r["axis_provenance"]["cp_ring"]["inferred"]}


def test_the_same_exchange_around_experts_stays_ep(runs):
    order = _raw_order(runs["moe"] / "rank0.pt.trace.json")
    assert order[:3] == ["c10d::alltoall_base_", "moe_experts", "c10d::alltoall_base_"]
    r = analyze(runs["moe"])
    for rank in r["ranks"]:
        cats = rank["phases"]["trace"]["categories"]
        assert cats["ep_all_to_all"]["total_us"] > 0 and cats["cp_ring"]["total_us"] == 0
    assert r["axis_reasons"] == {}
