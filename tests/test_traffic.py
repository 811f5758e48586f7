"""EP all-to-all traffic (issue 61): who sends how much to whom, per phase, from the sizes the trace
recorded, checked against truths computed here from the raw data (the router's own counts in
timings.json; the splits a torch job passed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from commprobe.analyzers.analysis import analyze
from commprobe.analyzers.cross_rank.traffic import IMBALANCE_RULE
from commprobe.analyzers.per_rank.traffic import c10d_splits, own_span_splits
from commprobe.probe.launch import launch
from tests import workers
from tests.conftest import ROOT

EP_JOB = ["--preset", "moe-tiny", "--tp", "1", "--ep", "2", "--steps", "8", "--prompt-len", "16", "--repeats", "2"]


def _profile(out, fault: str, backend: str = "gloo"):
    r = subprocess.run([sys.executable, "-m", "commprobe.probe.cli", "profile", *EP_JOB, "--backend", backend,
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "COMMPROBE_FAULT": fault})
    assert r.returncode == 0, r.stderr[-2000:]


def _routed_load(bundle, phase: str, ep: int = 2) -> list[int]:
    """From timings.json alone: tokens routed to each EP rank's experts (contiguous slices), summed
    over ranks and layers."""
    doc = json.loads((bundle / "timings.json").read_text())
    per_expert = None
    for r in doc["ranks"]:
        for layer in r["routed_tokens"][phase]:
            per_expert = layer if per_expert is None else [a + b for a, b in zip(per_expert, layer)]
    per = len(per_expert) // ep
    return [sum(per_expert[i * per:(i + 1) * per]) for i in range(ep)]


def _routed_truth(bundle, phase: str, ep: int = 2) -> tuple[float, int]:
    """(busiest / mean, the busiest rank) of _routed_load."""
    load = _routed_load(bundle, phase, ep)
    return max(load) / (sum(load) / ep), max(range(ep), key=load.__getitem__)


@pytest.mark.parametrize("backend", ["gloo", "dda"])
def test_a_hot_expert_gives_the_routed_imbalance_and_names_its_rank(tmp_path, backend):
    """hot-expert:3@60 sends 60 % of the tokens to expert 3 (on EP rank 1): the dispatch matrix's
    busiest receiver over the mean equals what the router's counts make it (within 5 %), its rank is
    named, and the finding says routing."""
    _profile(tmp_path / "run", "hot-expert:3@60", backend)
    res = analyze(tmp_path / "run")
    for phase in ("prefill", "decode"):
        t = res["phases"][phase]["all_to_all"]
        want, hot = _routed_truth(tmp_path / "run", phase)
        assert t["sizes"] == "recorded" and t["consistent"] and t["dispatch_calls"] > 0, t
        assert t["imbalance"] == pytest.approx(want, rel=0.05), (phase, t["imbalance"], want)
        assert t["hot_rank"] == hot == 1 and t["skew"].startswith("rank 1 receives")
        # moe-tiny's experts cost next to nothing: whether the skew is what the others wait for is
        # the phase's waiting's to say; either way the words name rank 1 and say which it is
        split = t["time"]  # every sized call matched across the two ranks: judged on their own waits
        assert split["calls"] == t["sized_calls"] and "own waits" in t["judged_on"]
        assert t["hot_rank_wait_share"] == pytest.approx(split["wait_for_hot_us"] / split["wait_us"])
        assert 0 <= split["wait_for_hot_us"] <= split["wait_us"] and 0 <= split["extra_bytes_us_at_most"] <= split["transfer_us"]
        if t["finding"]:
            assert t["hot_rank_wait_share"] >= 0.5 and "others wait for it" in t["finding"]
            assert res["phases"][phase]["recommendations"][0] == t["finding"]
        else:
            assert "of these calls' time" in t["note"] and "µs waiting for it" in t["note"]
        # what each rank received in the dispatches is its experts' routed tokens, times one row's bytes
        # (dim 64 x 4 B) and the traced repetitions: exactly proportional
        load = _routed_load(tmp_path / "run", phase)
        reps = t["received"][hot] / (load[hot] * 256)
        assert reps == int(reps) >= 1 and t["received"] == [n * 256 * int(reps) for n in load]
    # the calls' time, from the raw spans of both ranks (one clock: one host's base): each call's
    # transfer is the last starter's duration, every other rank's excess over it its wait (the
    # analyzer keeps times in single precision: a few ns per call apart)
    transfer, wait = _raw_a2a_times(tmp_path / "run")
    assert sum(res["phases"][p]["all_to_all"]["time"]["transfer_us"] for p in ("prefill", "decode")) == pytest.approx(transfer, rel=1e-4)
    assert sum(res["phases"][p]["all_to_all"]["time"]["wait_us"] for p in ("prefill", "decode")) == pytest.approx(wait, rel=1e-4)


def _raw_a2a_times(bundle) -> tuple[float, float]:
    """(sum of transfers, sum of per-rank mean waits) over every all-to-all span of a 2-rank bundle.
    Tied starts: of two within 1 µs, the one that left first is the last arriver."""
    import gzip

    spans, bases = [], []
    for r in (0, 1):
        doc = json.load(gzip.open(bundle / f"rank{r}.trace.json.gz"))
        bases.append(int(doc["baseTimeNanoseconds"]))
        spans.append(sorted((e["ts"], e["dur"]) for e in doc["traceEvents"]
                            if e.get("ph") == "X" and e.get("name", "").startswith("commprobe/comm/ep/all_to_all/")))
    assert len(spans[0]) == len(spans[1]) > 0
    shift = (bases[1] - bases[0]) / 1e3
    transfer = wait = 0.0
    for (s0, d0), (s1, d1) in zip(*spans):
        s1 += shift
        # the later starter; starts within the clock's resolution (1 µs) are one arrival, of which
        # the one that left first sets the transfer
        t = (d0 if s0 + d0 <= s1 + d1 else d1) if abs(s0 - s1) <= 1.0 else d0 if s0 > s1 else d1
        transfer += t
        wait += (max(0.0, d0 - t) + max(0.0, d1 - t)) / 2
    return transfer, wait


def test_the_report_and_the_terminal_show_the_matrix(tmp_path):
    """The HTML report has the section and a heatmap per phase with a matrix; the terminal the line
    and the matrix (a real run of the hot-expert fault)."""
    from commprobe.reports.html import render_html
    from tests.conftest import run_cli

    _profile(tmp_path / "run", "hot-expert:3@60")
    page = render_html(analyze(tmp_path / "run"))
    assert 'id="all-to-all"' in page and 'id="fig-traffic-prefill"' in page and 'id="fig-traffic-decode"' in page
    r = run_cli("analyze", str(tmp_path / "run"))
    assert r.returncode == 0 and "EP all-to-all, prefill: rank 1 receives" in r.stdout
    assert "from \\ to" in r.stdout and "received" in r.stdout


def test_a_balanced_router_gives_no_finding(tmp_path):
    _profile(tmp_path / "run", "balanced-router@100")
    res = analyze(tmp_path / "run")
    for phase in ("prefill", "decode"):
        t = res["phases"][phase]["all_to_all"]
        assert _routed_truth(tmp_path / "run", phase)[0] == 1.0
        assert t["imbalance"] == pytest.approx(1.0) and t["finding"] is None and t["skew"] is None, t
    assert IMBALANCE_RULE["imbalance_at_least"] > 1.0


def test_a_torch_jobs_uneven_all_to_all_single_gives_the_matrix_it_sent(tmp_path):
    """A real 3-rank gloo job's all_to_all_single with uneven splits, traced with record_shapes: the
    matrix is exactly what was sent (rows x 16 bytes, two calls), sender x receiver."""
    out = tmp_path / "traces"
    out.mkdir()
    sends = launch(workers.a2a_uneven_trace, 3, (str(out), True), timeout=120)
    res = analyze(out)
    (t,) = [p["all_to_all"] for p in res["phases"].values() if "all_to_all" in p]
    want = [[2 * 16 * rows for rows in send] for send in sends]
    assert t["sizes"] == "recorded" and t["consistent"] and t["ranks"] == [0, 1, 2]
    assert t["matrix"] == want
    assert t["received"] == [sum(want[s][d] for s in range(3)) for d in range(3)]  # no call is its own transpose


def test_without_recorded_shapes_the_sizes_are_said_missing(tmp_path):
    out = tmp_path / "traces"
    out.mkdir()
    launch(workers.a2a_uneven_trace, 2, (str(out), False), timeout=120)
    (t,) = [p["all_to_all"] for p in analyze(out)["phases"].values() if "all_to_all" in p]
    assert t["sizes"] == "not recorded" and t["finding"] is None and "record_shapes" in t["note"]
    assert "matrix" not in t


@pytest.mark.parametrize("name", [
    "commprobe/comm/ep/all_to_all/bytes=8/dtype=float32/group=2/backend=gloo/grank=5/send=1.2/recv=3.4",  # rank out of range
    "commprobe/comm/ep/all_to_all/bytes=8/dtype=float32/group=2/backend=gloo/grank=0/send=1.2/recv=3",  # lengths differ
    "commprobe/comm/ep/all_to_all/bytes=8/dtype=float32/group=2/backend=gloo/grank=0/send=1..2/recv=3.4",
    "commprobe/comm/ep/all_to_all/bytes=8/dtype=float32/group=2/backend=gloo/grank=0/send=/recv=",
    "commprobe/comm/ep/all_to_all/bytes=8/dtype=float32/group=2/backend=gloo",
])
def test_a_damaged_split_in_a_span_is_no_size(name):
    assert own_span_splits(name) is None


@pytest.mark.parametrize("args", [
    {}, {"Concrete Inputs": "x"}, {"Concrete Inputs": ["", "", "", "[1, 2]", "[1]"], "Input Dims": [[3, 4], [3, 4]],
                                   "Input type": ["float", "float"]},
    {"Concrete Inputs": ["", "", "", "[1, -2]", "[1, 2]"], "Input Dims": [[3, 4], [3, 4]], "Input type": ["float", "float"]},
    {"Concrete Inputs": ["", "", "", "[1, 2]", "[1, 2]"], "Input Dims": [[3, 4], [3, 4]], "Input type": ["float", "weird"]},
    {"Concrete Inputs": ["", "", "", "[]", "[]"], "Input Dims": [[3, 4], [3, 4]], "Input type": ["float", "float"]},
    {"Concrete Inputs": ["", "", "", "[1e400]", "[1]"], "Input Dims": [[3, 4], [3, 4]], "Input type": ["float", "float"]},
])
def test_damaged_or_missing_c10d_splits_are_no_size(args):
    assert c10d_splits(args) is None


def test_c10d_splits_in_bytes():
    args = {"Concrete Inputs": ["", "", "", "[2, 4]", "[1, 3]"], "Input Dims": [[6, 4], [4, 4]], "Input type": ["float", "float"]}
    assert c10d_splits(args) == ([16, 48], [32, 64])


def test_balanced_router_fault_parses_and_refuses_a_target():
    from commprobe.probe.faults import perf_fault

    f = perf_fault("balanced-router@100")
    assert (f.kind, f.target, f.dose) == ("balanced-router", None, 100.0)
    with pytest.raises(ValueError, match="takes no target"):
        perf_fault("balanced-router:1@100")


def test_nccl_split_sizes_as_torch_records_them():
    """record_param_comms' all-to-all args (torch's ParamCommsUtils keys): rows as JSON strings,
    elements per row from the message's element count; an even split ("[]") is no size."""
    from commprobe.analyzers.per_rank.traffic import nccl_splits

    args = {"Collective name": "all_to_allv", "dtype": "Float", "In msg nelems": 24, "Out msg nelems": 16,
            "In split size": "[1, 2]", "Out split size": "[2, 2]"}
    assert nccl_splits(args) == ([32, 64], [32, 32])  # 8 floats a row in, 4 a row out
    for bad in ({**args, "In split size": "[]"}, {**args, "In msg nelems": 25}, {**args, "dtype": "Weird"},
                {**args, "Out split size": "[2"}, {**args, "Out split size": "[2, 2, 2]"}):
        assert nccl_splits(bad) is None, bad


def test_a_kineto_record_param_comms_all_to_all_gives_its_matrix(tmp_path):
    """Two ranks' traces in Kineto's shape with NCCL's record_param_comms all-to-all (the args torch
    writes), read through both readers (the C scanner and msgspec): the matrix from the splits."""
    import gzip

    from commprobe.analyzers.readers.kineto import load_trace

    def trace(rank: int) -> dict:
        send = [[1, 3], [2, 2]][rank]
        recv = [[1, 2], [3, 2]][rank]
        evs = []
        for i in range(2):
            t = 100.0 + i * 50
            evs.append({"ph": "X", "name": "record_param_comms", "cat": "cpu_op", "ts": t, "dur": 10, "pid": 1, "tid": 1,
                        "args": {"Collective name": "all_to_allv", "dtype": "Float", "In msg nelems": 4 * sum(send),
                                 "Out msg nelems": 4 * sum(recv), "In split size": json.dumps(send),
                                 "Out split size": json.dumps(recv), "Group size": 2, "Process Group Name": "0",
                                 "Process Group Description": "ep_group", "Seq": i}})
        return {"traceEvents": evs, "distributedInfo": {"rank": rank, "world_size": 2}}

    d = tmp_path / "traces"
    d.mkdir()
    for r in range(2):
        with gzip.open(d / f"rank{r}.json.gz", "wt") as f:
            json.dump(trace(r), f)
    for env in ({}, {"COMMPROBE_PURE_PYTHON": "1"}):
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            assert load_trace(d / "rank0.json.gz").a2a_args  # the reader kept the split sizes
            (t,) = [p["all_to_all"] for p in analyze(d)["phases"].values() if "all_to_all" in p]
        finally:
            for k, v in old.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        assert t["sizes"] == "recorded" and t["consistent"], t
        assert t["matrix"] == [[2 * 16, 2 * 48], [2 * 32, 2 * 32]]


def test_the_perfetto_export_has_a_counter_of_each_calls_imbalance(tmp_path):
    """`analyze --perfetto`: a counter track whose values are the dispatches' per-call imbalances."""
    from commprobe.analyzers.perfetto import export

    _profile(tmp_path / "run", "hot-expert:3@60")
    export(tmp_path / "run", tmp_path / "out.json")
    counters = [e for e in json.loads((tmp_path / "out.json").read_text())["traceEvents"]
                if e.get("ph") == "C" and e["name"].startswith("EP all-to-all imbalance")]
    res = analyze(tmp_path / "run")
    want = sum(p["all_to_all"]["dispatch_calls"] for p in res["phases"].values() if "all_to_all" in p)
    assert len(counters) == want > 0
    lo = min(p["all_to_all"]["per_call"]["min"] for p in res["phases"].values() if "all_to_all" in p)
    hi = max(p["all_to_all"]["per_call"]["max"] for p in res["phases"].values() if "all_to_all" in p)
    assert all(lo - 1e-3 <= e["args"]["imbalance"] <= hi + 1e-3 for e in counters)


def test_two_groups_of_one_axis_are_summed_not_overwritten():
    """EP x TP: two EP groups whose ranks share group ranks (0 and 1 in each). Their rows add up
    in one matrix, said as groups_summed; nothing is dropped."""
    from commprobe.analyzers.cross_rank.traffic import phase_traffic

    def rank(grank: int, send: list[int], recv: list[int]) -> dict:
        return {"decode": {"ep": {"grank": grank, "calls": 1, "unsized": 0, "k": [0], "send": [send], "recv": [recv]}}}

    # group A = ranks 0, 2: 0 sends [10, 30] (to itself, to 2); group B = ranks 1, 3
    per_rank = {0: rank(0, [10, 30], [10, 5]), 2: rank(1, [5, 15], [30, 15]),
                1: rank(0, [1, 3], [1, 2]), 3: rank(1, [2, 4], [3, 4])}
    t = phase_traffic(per_rank, "decode")
    assert t["groups_summed"] == 2 and t["consistent"]
    assert t["matrix"] == [[11, 33], [7, 19]] and t["received"] == [18, 52]


def _rank_doc(grank, send, recv, k=(0,)):
    return {"decode": {"ep": {"grank": grank, "calls": len(k), "unsized": 0, "k": list(k), "send": [send] * len(k),
                              "recv": [recv] * len(k)}}}


def test_one_rank_of_a_group_gives_no_matrix_and_says_why():
    """One rank's trace of a two-rank group: no call is held by every rank, so no matrix, no imbalance."""
    from commprobe.analyzers.cross_rank.traffic import phase_traffic

    t = phase_traffic({0: _rank_doc(0, [10, 30], [10, 5])}, "decode")
    assert t["sizes"] == "recorded" and "matrix" not in t and t["finding"] is None
    assert "1 of 2 group ranks' traces" in t["note"]


def test_a_rank_recording_another_group_size_is_left_out_not_a_crash():
    from commprobe.analyzers.cross_rank.traffic import phase_traffic

    per_rank = {0: _rank_doc(0, [10, 30], [10, 5]), 1: _rank_doc(1, [5, 15], [30, 15]),
                2: _rank_doc(0, [1, 2, 3], [1, 2, 3])}
    t = phase_traffic(per_rank, "decode")
    assert t["matrix"] == [[10, 30], [5, 15]] and "rank(s) 2 record groups of another size" in t["note"]


def test_a_group_rank_several_groups_hold_is_named_as_a_group_rank():
    from commprobe.analyzers.cross_rank.traffic import judge, phase_traffic

    per_rank = {0: _rank_doc(0, [10, 90], [10, 5]), 2: _rank_doc(1, [5, 95], [90, 95]),
                1: _rank_doc(0, [10, 90], [10, 5]), 3: _rank_doc(1, [5, 95], [90, 95])}
    t = phase_traffic(per_rank, "decode")
    assert t["ranks"] == [None, None] and t["hot_rank"] is None and t["skew"].startswith("group rank 1 receives")
    judge(t, {"wait_caused_by": {"2": 0.9}, "wait_share": 0.5, "transfer_share": 0.1})
    assert t["finding"] is None and "cannot be told" in t["note"]


def test_the_time_split_of_known_calls():
    """Three ranks; ranks 0 and 2 dispatch 30 bytes each to rank 1 (global rank 11), which sends
    them back. As routed, rank 1 moves 60 bytes; routed evenly, the busiest rank moves 20: each call
    could save at most 2/3 of its 90 µs transfer. The first call waits for rank 11 (mean wait 4 µs),
    the second for rank 10 (1 µs)."""
    from commprobe.analyzers.cross_rank.traffic import time_split

    m = [[0, 30, 0], [0, 0, 0], [0, 30, 0]]
    back = [list(r) for r in zip(*m)]
    times = [{"transfer": 90.0, "last": 11, "wait": {10: 5.0, 11: 0.0, 12: 7.0}},
             {"transfer": 90.0, "last": 10, "wait": {10: 0.0, 11: 3.0, 12: 0.0}}]
    t = time_split([m, back], [False, True], times, hot=[11])
    assert t["calls"] == 2 and t["transfer_us"] == 180.0 and t["wait_us"] == 5.0 and t["wait_for_hot_us"] == 4.0
    assert t["extra_bytes_us_at_most"] == pytest.approx(120.0)
    even = [[10, 10, 10], [10, 10, 10], [10, 10, 10]]  # already even: nothing to save
    assert time_split([even], [False], times[:1], hot=[11])["extra_bytes_us_at_most"] == 0.0


def test_the_matrix_of_many_random_calls_is_their_sum():
    """Arrays in, as the per-rank map ships them: 6 ranks, 40 random calls, ranks listing their calls
    in different orders and rank 5 missing one call (left out of every matrix)."""
    import numpy as np

    from commprobe.analyzers.cross_rank.traffic import phase_traffic

    rng = np.random.default_rng(7)
    m = rng.integers(0, 1000, (40, 6, 6))
    per_rank = {}
    for r in range(6):
        order = rng.permutation(40) if r != 5 else np.arange(1, 40)
        per_rank[r] = {"decode": {"ep": {"grank": r, "calls": len(order), "unsized": 0, "k": order,
                                         "send": m[order, r, :], "recv": m[order, :, r]}}}
    t = phase_traffic(per_rank, "decode")
    assert t["consistent"] and t["sized_calls"] == 39 and t["matrix"] == m[1:].sum(axis=0).tolist()
    cols = m[1:].sum(axis=1)
    assert t["per_call"]["max"] == pytest.approx(float((cols.max(axis=1) / cols.mean(axis=1)).max()))


def test_a_real_deepspeed_moe_trace_says_its_even_bytes_cannot_show_routing(real_traces):
    """DeepSpeed-MoE's all-to-all pads every expert's buffer to capacity and splits it evenly: the
    trace records the split lists empty. Counted from the raw events here: 8 such ops per rank, no
    other all-to-all; the result says even splits, imbalance 1.0 by construction, no finding, and
    why routing cannot show in those bytes."""
    import gzip

    from tests.conftest import invariant_violations

    path = real_traces / "deepspeed-moe-cpu-ep2"
    for r in (0, 1):
        ev = [e for e in json.load(gzip.open(path / f"rank{r}.trace.json.gz"))["traceEvents"]
              if e.get("name") == "c10d::alltoall_base_"]
        assert len(ev) == 8 and all(e["args"]["Concrete Inputs"][3:5] == ["[]", "[]"] for e in ev)
    res = analyze(path)
    (t,) = [p["all_to_all"] for p in res["phases"].values() if p.get("all_to_all")]
    assert t["sizes"] == "even splits" and t["even_calls"] == t["calls"] == 8 and t["unsized_calls"] == 0
    assert t["imbalance"] == 1.0 and t["finding"] is None and t["skew"] is None and "matrix" not in t
    assert "routing skew cannot show in the bytes" in t["note"]
    assert invariant_violations(res, path) == []


def test_even_calls_beside_unsized_ones_say_no_imbalance():
    """Even splits prove even bytes only for those calls: beside calls with no sizes at all, the phase's
    imbalance cannot be told, and says both."""
    from commprobe.analyzers.cross_rank.traffic import phase_traffic

    doc = {"decode": {"ep": {"grank": None, "calls": 3, "unsized": 1, "even": 2, "k": [], "send": [], "recv": []}}}
    t = phase_traffic({0: doc, 1: doc}, "decode")
    assert t["sizes"] == "not recorded" and t.get("imbalance") is None and t["finding"] is None
    assert "1 all-to-all call(s) per rank carry no split sizes" in t["note"] and "2 other(s) split" in t["note"]
    only_even = {"decode": {"ep": {**doc["decode"]["ep"], "unsized": 0, "calls": 2}}}
    t = phase_traffic({0: only_even, 1: only_even}, "decode")
    assert t["sizes"] == "even splits" and t["imbalance"] == 1.0


def test_a_real_megatron_moe_dispatcher_trace_gives_the_matrix_its_splits_say(real_traces):
    """Megatron-Core's all-to-all dispatcher sends the tokens, their probs, then (after the experts)
    the tokens back. Counted here from the raw events: the token dispatches are the ops whose input is
    the rank's 32 tokens of 64 floats; what each rank received in them is its output splits x 256 B.
    The analysis tells the dispatches from the probs call and the combine, and gives exactly those
    bytes, the hot rank (expert 3 lives on rank 1) and the time split."""
    import gzip

    path = real_traces / "megatron-moe-cpu-ep2"
    received, dispatches = [0, 0], 0
    for r in (0, 1):
        for e in json.load(gzip.open(path / f"rank{r}.trace.json.gz"))["traceEvents"]:
            if e.get("name") == "c10d::alltoall_base_" and e["args"]["Input Dims"][1] == [32, 64]:
                received[r] += sum(json.loads(e["args"]["Concrete Inputs"][3])) * 64 * 4
                dispatches += 1
    res = analyze(path)
    (t,) = [p["all_to_all"] for p in res["phases"].values() if p.get("all_to_all")]
    assert t["sizes"] == "recorded" and t["consistent"] and t["sized_calls"] == t["calls"] == 12
    assert t["dispatch_calls"] == dispatches // 2 == 4 and t["received"] == received
    assert t["imbalance"] == pytest.approx(max(received) / (sum(received) / 2)) and t["hot_rank"] == 1
    assert t["skew"].startswith("rank 1 receives 1.71x") and t["time"]["calls"] == 12


def test_a_group_too_large_for_every_calls_matrix_says_what_the_matrix_covers(monkeypatch):
    """A thousand ranks would make each call's matrix a million pair sizes: the matrices are bounded
    (MAX_MATRIX_CELLS), cover the first calls that fit, and say so."""
    import numpy as np

    from commprobe.analyzers.cross_rank import traffic

    monkeypatch.setattr(traffic, "MAX_MATRIX_CELLS", 4 * 4 * 10)
    m = np.random.default_rng(3).integers(0, 100, (25, 4, 4))
    per_rank = {r: {"decode": {"ep": {"grank": r, "calls": 25, "unsized": 0, "k": np.arange(25),
                                      "send": m[:, r, :], "recv": m[:, :, r]}}} for r in range(4)}
    t = traffic.phase_traffic(per_rank, "decode")
    assert t["sized_calls"] == 10 and t["matrix"] == m[:10].sum(axis=0).tolist()
    assert "the matrices cover the first 10 of 25 calls" in t["note"]
