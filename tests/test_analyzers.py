"""Analyzers: exact answers on synthetic traces, injected delays on real runs, the shared real traces,
bad input. The analyzers never import torch (checked in a clean interpreter)."""

import gzip
import json
import subprocess
import sys

import pytest

from commprobe.analyzers.analysis import SCHEMA, analyze, compare
from commprobe.analyzers.per_rank.classify import CATEGORIES, classify, classify_name
from commprobe.analyzers.per_rank.links import link_kernels_to_host_ops
from commprobe.analyzers.readers.kineto import load_trace
from commprobe.analyzers.readers.model import TraceError
from tests.conftest import ROOT, run_cli
from tests.kineto_events import BASE_NS, ev, write


def _k(name, ts, dur, stream, device=0, cat="kernel", **args):
    return ev(name, ts, dur, stream, cat, pid=device, **args)


def _nccl(ts, dur, nelems=1024):
    return _k("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", ts, dur, 20,
              **{"Collective name": "allreduce", "In msg nelems": nelems, "Out msg nelems": nelems, "dtype": "Float",
                 "Group size": 2, "Process Group Name": "0", "Process Group Description": "default_pg"})


def _write(path, rank, events, base=BASE_NS):
    return write(path, events, rank, world=2, base=base)


def _gpu_rank(rank, comm_start):
    step = [{"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#7", "ts": 0, "dur": 1000, "pid": 0, "tid": 7},
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "ts": -50, "dur": 900, "pid": 1, "tid": 1}]
    compute = [_k("ampere_sgemm_128x64_nn", 0, 400, 7), _k("void at::native::vectorized_elementwise_kernel", 500, 400, 7)]
    return step + compute + [_nccl(comm_start, 600 - comm_start)]


@pytest.fixture
def gpu_pair(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    _write(d / "rank0.trace.json.gz", 0, _gpu_rank(0, 300))
    _write(d / "rank1.trace.json.gz", 1, _gpu_rank(1, 450))  # arrives 150 µs late
    return d


def test_synthetic_overlap_exposure_and_straggler_are_exact(gpu_pair):
    r = analyze(gpu_pair)
    assert r["schema"] == SCHEMA
    r0 = r["ranks"][0]["phases"]["step"]
    assert r["ranks"][0]["timeline"] == "device" and r0["e2e_us"] == 1000 and r0["windows"] == 1
    assert r0["categories"]["tp_allreduce"] == {"total_us": 300, "exposed_us": 100, "exposed_wait_us": 100}  # [400, 500]
    assert r0["categories"]["compute"]["exposed_us"] == 800 and r0["idle_us"] == 100
    r1 = r["ranks"][1]["phases"]["step"]
    assert r1["categories"]["tp_allreduce"] == {"total_us": 150, "exposed_us": 50, "exposed_wait_us": 0}
    c = r["collectives"]
    # rank 1 caused all the waiting, but one call cannot tell a slow rank from the noise (straggler.py)
    assert c["matched_calls"] == 1 and c["straggler"] is None and c["straggler_rule"]["most_waiting_caused_by"] == 1
    assert c["ranks"][0]["wait_us"] == 150 and c["ranks"][0]["transfer_us"] == 150
    assert c["ranks"][1]["wait_us"] == 0 and c["ranks"][1]["transfer_us"] == 150
    # Of rank 0's 100 µs exposed allreduce, all is waiting for rank 1 (150 µs of wait, capped).
    assert r0["categories"]["tp_allreduce"]["exposed_wait_us"] == 100
    assert r1["categories"]["tp_allreduce"]["exposed_wait_us"] == 0
    (b,) = r["message_sizes"]
    assert (b["op"], b["axis"], b["bucket_bytes"], b["count"], b["median_us"]) == ("allreduce", "tp", 4096, 2, 150)
    assert b["algbw_GBps"] == pytest.approx(4096 / 150 / 1e3) and b["busbw_GBps"] == pytest.approx(b["algbw_GBps"])
    p = r["phases"]["step"]
    assert p["exposed_share"]["tp_allreduce"] == pytest.approx((0.1 + 0.05) / 2)
    assert p["verdict"] == "compute-bound"
    assert r["unclassified"]["count"] == 0


def test_out_of_order_events_give_the_same_answer(gpu_pair, tmp_path):
    d = tmp_path / "shuffled"
    d.mkdir()
    for rank in (0, 1):
        ev = _gpu_rank(rank, 300 if rank == 0 else 450)
        _write(d / f"rank{rank}.trace.json.gz", rank, list(reversed(ev)))
    a, b = analyze(gpu_pair), analyze(d)
    assert a["ranks"] == [{**x, "file": y["file"]} for x, y in zip(b["ranks"], a["ranks"])] or \
        [x["phases"] for x in a["ranks"]] == [x["phases"] for x in b["ranks"]]
    assert a["collectives"]["ranks"] == b["collectives"]["ranks"]


def test_idle_device_is_host_bound_not_communication_bound(tmp_path):
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 10000, "pid": 1, "tid": 1},
          _k("small_kernel", 100, 50, 7), _nccl(2000, 1500), _k("small_kernel", 9000, 50, 7)]
    p = analyze(_write(tmp_path / "rank0.json.gz", 0, ev))["phases"]["step"]
    assert p["idle_share"] == pytest.approx(1 - 1600 / 10000)
    assert p["verdict"] == "host/launch-bound" and p["exposed_comm_share"] == pytest.approx(0.15)


@pytest.mark.parametrize("name, cat, category, op", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "kernel", "tp_allreduce", "allreduce"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "kernel", "other_comm", "all_gather"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "kernel", "other_comm", "send_recv"),  # p2p of unknown axis: never CP ring
    ("void vllm::cross_device_reduce_1stage<float, 8>(...)", "kernel", "tp_allreduce", "allreduce"),
    ("void aiter::cross_device_reduce_2stage_naive<__hip_bfloat16, 8, false>(aiter::RankData*)", "kernel",
     "tp_allreduce", "allreduce"),
    ("void mori::moe::EpDispatchIntraNodeKernel<__hip_bfloat16>(mori::moe::EpDispatchCombineArgs<__hip_bfloat16>)",
     "kernel", "ep_all_to_all", "all_to_all"),
    ("mori::moe::EpCombineInterNodeLLKernel<float>(args)", "kernel", "ep_all_to_all", "all_to_all"),
    ("void c10d::symmetric_memory::two_shot_all_reduce_kernel<...>", "kernel", "tp_allreduce", "allreduce"),
    ("void tensorrt_llm::kernels::oneShotAllReduceKernel<__nv_bfloat16, 8>(...)", "kernel", "tp_allreduce", "allreduce"),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(...)", "kernel", "ep_all_to_all", "all_to_all"),
    ("void deep_ep::internode_ll::combine<...>", "kernel", "ep_all_to_all", "all_to_all"),
    ("c10d::allreduce_", "cpu_op", "tp_allreduce", "allreduce"),
    ("gloo:all_to_all", "user_annotation", "ep_all_to_all", "all_to_all"),
    ("commprobe/comm/cp/send_recv/bytes=4096/dtype=float32/group=2/backend=dda", "user_annotation", "cp_ring", "send_recv"),
    ("commprobe/comm/cp/all_to_all/bytes=4096/dtype=float32/group=2/backend=gloo", "user_annotation", "cp_ring", "all_to_all"),
    ("commprobe/comm/ep/all_gather/bytes=4096/dtype=float32/group=2/backend=gloo", "user_annotation", "ep_all_to_all", "all_gather"),
    ("commprobe/cp/pass-kv/step=1", "user_annotation", "marker", None),
    ("ampere_sgemm_128x64_nn", "kernel", "compute", None),
    ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", "memcpy", None),
    ("some_custom_event", "weird_category", "other", None),
])
def test_names_are_classified(name, cat, category, op):
    c = classify_name(name, cat)
    assert CATEGORIES[c.category] == category and c.op == op


def test_user_rules_classify_custom_kernels(tmp_path):
    ev = [_k("my_fancy_ar_kernel", 0, 100, 7), _k("gemm", 100, 100, 7)]
    path = _write(tmp_path / "rank0.json.gz", 0, ev)
    assert analyze(path)["ranks"][0]["phases"]["trace"]["categories"]["tp_allreduce"]["total_us"] == 0
    toml = tmp_path / "rules.toml"
    toml.write_text('[[rule]]\npattern = "my_fancy_ar"\ncategory = "tp_allreduce"\naxis = "tp"\nop = "allreduce"\n')
    js = tmp_path / "rules.json"
    js.write_text(json.dumps([{"pattern": "my_fancy_ar", "category": "tp_allreduce"}]))
    for rules in (toml, js):
        r = analyze(path, rules_file=str(rules))
        assert r["ranks"][0]["phases"]["trace"]["categories"]["tp_allreduce"]["exposed_us"] == 100


def test_injected_delays_are_attributed_within_ten_percent(tmp_path):
    from commprobe.probe.launch import launch
    from tests import workers

    delay, calls = 0.05, 8
    launch(workers.delayed_allreduce_traces, 2, (str(tmp_path), delay, calls), timeout=120)
    base, inside, before = (analyze(tmp_path / m) for m in ("base", "inside", "before"))
    injected = delay * calls * 1e6
    for rank in (0, 1):
        # Every rank sleeps inside the collective: that is collective time on every rank (transfer, as no
        # rank waits for another), all of it exposed TP allreduce, none of it compute.
        dec = inside["ranks"][rank]["phases"]["decode"]["categories"]
        assert dec["tp_allreduce"]["exposed_us"] >= injected and dec["compute"]["exposed_us"] < 0.1 * injected
        added = inside["collectives"]["ranks"][rank]["transfer_us"] - base["collectives"]["ranks"][rank]["transfer_us"]
        assert added == pytest.approx(injected, rel=0.1), f"rank {rank}: transfer grew by {added} µs"
    # A late rank: its peer's time in the collective is waiting for the straggler, named as rank 1.
    c = before["collectives"]
    assert c["straggler"] == 1
    assert c["ranks"][0]["wait_us"] == pytest.approx(injected, rel=0.1)
    assert c["ranks"][1]["wait_us"] < 0.1 * injected
    # The verdict names the cause: waiting for rank 1 is imbalance, not the collective (transfer).
    dec = before["phases"]["decode"]
    assert dec["verdict"] == "imbalance-bound", dec["summary"]
    assert dec["communication_cause"]["class"] == "skew-dominated" and dec["communication_cause"]["culprit"] == 1
    assert "rank 1" in dec["summary"] and any("rank 1" in r for r in dec["recommendations"])
    ins = inside["phases"]["decode"]
    assert ins["verdict"] == "communication-bound" and ins["communication_cause"]["class"] == "transfer-dominated"
    assert not any(c["cause"] == "skew" for c in ins["communication_cause"]["causes"])  # whoever arrived last, no skew
    # ... and per phase: the decode phase's exposed allreduce on rank 0 is that wait.
    dec0 = before["ranks"][0]["phases"]["decode"]["categories"]["tp_allreduce"]
    assert dec0["exposed_wait_us"] == pytest.approx(injected, rel=0.1)


def test_compare_gives_ratios(gpu_pair):
    a = analyze(gpu_pair)
    c = compare(a, a)
    assert c["phases"]["step"]["ratio"] == 1.0 and c["message_sizes"][0]["ratio"] == 1.0


TRACES = {
    "nccl_parser_config_nccl_data.json.gz": {"allreduce": 15, "broadcast": 6},
    # SendRecv kernels all, launched by nccl:all_to_all, nccl:all_reduce and nccl:_all_gather_base
    # (counted independently from the raw JSON: correlation -> cudaLaunchKernel -> enclosing op)
    "trace_filter_sampled_rank-0.json.gz": {"all_to_all": 4, "allreduce": 4, "all_gather": 2},
    "trace_filter_sampled_rank-1.json.gz": {"all_to_all": 4, "allreduce": 4, "all_gather": 2},
    "amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz": {},
    "cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": {},
}


@pytest.mark.parametrize("name", sorted(TRACES))
def test_shared_real_traces_load_classify_and_analyze(real_traces, name):
    path = real_traces / "hta" / name
    t = load_trace(path)
    cls = classify(t)
    link_kernels_to_host_ops(t, cls)
    dev = t.is_device()
    kernels = {}
    for i, op in enumerate(cls.comm_op):
        if op and dev[i]:
            kernels[op] = kernels.get(op, 0) + 1
    assert kernels == TRACES[name]
    assert not (cls.category == CATEGORIES.index("cp_ring")).any()  # nothing here declares a CP axis
    r = analyze(path)
    assert r["phases"] and all(p["verdict"] for p in r["phases"].values())
    if "rank-" in name:
        assert r["ranks"][0]["rank"] == int(name.split("rank-")[1].split(".")[0].split("_")[0])


def test_two_real_ranks_in_one_directory(real_traces, tmp_path):
    for r in (0, 1):
        (tmp_path / f"trace_filter_sampled_rank-{r}.json.gz").symlink_to(
            real_traces / "hta" / f"trace_filter_sampled_rank-{r}.json.gz")
    res = analyze(tmp_path)
    assert [x["rank"] for x in res["ranks"]] == [0, 1]
    assert res["collectives"]["matched_calls"] == 10


def _bad(tmp_path, name, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return p


@pytest.mark.parametrize(argnames="name, data, needle", ids=["empty", "truncated", "text", "wrong-schema", "negative", "bad-event"], argvalues=[
    ("empty.json", b"", "empty file"),
    ("trunc.json.gz", gzip.compress(b'{"traceEvents": [' + b'{"ph": "X"},' * 1000)[:40], "truncated or corrupt gzip"),
    ("text.json", b"this is not json", "not JSON"),
    ("wrong.json", b'{"foo": 1}', "not a Kineto/Chrome trace"),
    ("neg.json", json.dumps({"traceEvents": [{"ph": "X", "name": "k", "ts": 5, "dur": -3}]}).encode(), "negative duration"),
    ("badev.json", json.dumps({"traceEvents": [{"ph": "X", "name": "k", "ts": "soon", "dur": 1}]}).encode(), "not a Kineto/Chrome trace"),
])
def test_bad_traces_are_one_line_and_exit_2(tmp_path, name, data, needle):
    p = _bad(tmp_path, name, data)
    with pytest.raises(TraceError, match=needle):
        analyze(p)
    r = run_cli("analyze", str(p))
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr


def test_bad_directories_and_oversized_traces(tmp_path, gpu_pair):
    (tmp_path / "none").mkdir()
    r = run_cli("analyze", str(tmp_path / "none"))
    assert r.returncode == 2 and "no traces" in r.stderr
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    _write(mixed / "a.json.gz", 0, _gpu_rank(0, 300))
    _write(mixed / "b.json.gz", 0, _gpu_rank(0, 300))
    r = run_cli("analyze", str(mixed))
    assert r.returncode == 2 and "rank 0 appears in two files" in r.stderr and "a.json.gz and " in r.stderr and "--rank-from" in r.stderr
    r = run_cli("analyze", str(gpu_pair), env={"COMMPROBE_MAX_TRACE_BYTES": "100"})
    assert r.returncode == 2 and "too large for memory" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_result_follows_its_json_schema(gpu_pair):
    schema = json.loads((ROOT / "analyzers" / "analysis.schema.json").read_text())
    r = analyze(gpu_pair)
    assert set(schema["required"]) <= set(r) and r["schema"] == schema["properties"]["schema"]["const"]
    phase_req = schema["properties"]["phases"]["additionalProperties"]["required"]
    assert all(set(phase_req) <= set(p) for p in r["phases"].values())
    assert r["phases"]["step"]["verdict"] in schema["properties"]["phases"]["additionalProperties"]["properties"]["verdict"]["enum"]


def test_analyzers_never_import_torch(gpu_pair):
    code = ("import sys; from analyzers.analysis import analyze; analyze(sys.argv[1]); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code, str(gpu_pair)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_clock_offset_between_hosts_is_corrected_by_collective_end(tmp_path):
    """Rank 1's clock runs 10 ms ahead: on raw clocks rank 0 would look late, but rank 0's calls end
    before rank 1 enters them, which one clock cannot show: arrival is read from the time in the
    call instead, and names rank 1, as the collectives' ends aligned do."""
    d = tmp_path / "skewed"
    d.mkdir()
    base = 1_700_000_000_000_000_000
    _write(d / "rank0.trace.json.gz", 0, _gpu_rank(0, 300), base=base)
    _write(d / "rank1.trace.json.gz", 1, _gpu_rank(1, 450), base=base - 10_000_000)  # 10 ms earlier base
    raw = analyze(d)
    # one call: rank 1 caused the waiting, too few calls to name it beyond the noise (straggler.py)
    assert raw["collectives"]["straggler_rule"]["most_waiting_caused_by"] == 1 and raw["collectives"]["straggler"] is None
    assert raw["collectives"]["arrival_rule"] == "durations"
    assert "before another rank entered them" in raw["collectives"]["arrival_rule_why"]
    assert raw["collectives"]["ranks"][0]["wait_us"] == pytest.approx(150)
    aligned = analyze(d, align="collective-end")
    assert aligned["collectives"]["straggler_rule"]["most_waiting_caused_by"] == 1
    assert aligned["collectives"]["ranks"][0]["wait_us"] == pytest.approx(150)
    assert aligned["collectives"]["offsets_us"]["1"] == pytest.approx(-10_000)


def test_collectives_match_by_sequence_number_when_traces_start_apart(tmp_path):
    """Rank 1's trace starts one collective later (the profiler started late there). Matched by
    order, every pair would be off by one; by the process group's sequence number (args "Seq")
    the three shared calls pair up, and rank 1 is the straggler by 100 µs on each."""
    def calls(rank, seqs):
        out = []
        for s in seqs:
            t = 1000 * s
            start = t + (100 if rank == 1 else 0)
            ev = _nccl(start, t + 400 + 50 * s - start)  # call s ends at t + 400 + 50 s on both ranks
            ev["args"]["Seq"] = s
            out.append(ev)
        return out

    d = tmp_path / "late-start"
    d.mkdir()
    _write(d / "rank0.trace.json.gz", 0, calls(0, [0, 1, 2, 3]))
    _write(d / "rank1.trace.json.gz", 1, calls(1, [1, 2, 3]))
    c = analyze(d)["collectives"]
    assert c["matched_calls"] == 3 and c["straggler"] == 1
    r0, r1 = c["ranks"]
    assert r0["wait_us"] == pytest.approx(300) and r1["wait_us"] == 0 and r1["times_last"] == 3


def test_timeline_segments_cover_the_window_when_coarsened():
    """More intervals than a drawing keeps: the smallest gaps close, the window's ends stay."""
    import numpy as np

    from commprobe.analyzers.per_rank.attribution import _coarsen

    s = np.arange(0, 10_000, 10.0)
    e = s + 3 + np.arange(1000) % 7  # gaps of 1..7 µs
    a, b = _coarsen(s, e, 500)
    assert len(a) == 500 and a[0] == 0 and b[-1] == e[-1]
    assert (b > a).all() and (a[1:] >= b[:-1]).all()
    assert (b - a).sum() >= (e - s).sum()  # nothing dropped, only gaps filled
    assert _coarsen(s[:10], e[:10], 500)[0] is not None and len(_coarsen(s[:10], e[:10], 500)[0]) == 10
