"""Traces that real deployments produce (issue: attribution that holds on them). Each synthetic
trace has exact expected numbers; the real DLRM set's truth was counted independently from
its raw JSON (kernel correlation -> cudaLaunchKernel -> enclosing nccl:* op)."""

from __future__ import annotations

import pytest

from commprobe.analyzers.analysis import analyze
from commprobe.analyzers.per_rank.classify import AXIS_SOURCES, CATEGORIES, classify, comm_mask
from commprobe.analyzers.per_rank.links import link_kernels_to_host_ops
from commprobe.analyzers.readers.kineto import load_trace
from tests.kineto_events import HOST, SIDE, STREAM, ev, launched, rpc, write

SENDRECV = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"


@pytest.fixture(params=["scanner", "msgspec"])
def reader(request, monkeypatch):
    """Both readers must give the same answer."""
    if request.param == "msgspec":
        monkeypatch.setenv("COMMPROBE_PURE_PYTHON", "1")
    return request.param


def kernel_classes(path):
    t = load_trace(path)
    c = classify(t)
    link_kernels_to_host_ops(t, c)
    dev = t.is_device()
    out = [(t.names[t.name_id[i]], CATEGORIES[c.category[i]], c.comm_op[i], c.comm_axis[i],
            AXIS_SOURCES[c.axis_source[i]], float(c.comm_bytes[i]), c.comm_group[i], int(c.seq[i]))
           for i in range(len(t.ts)) if dev[i] and comm_mask(c.category)[i]]
    return out, c.links


def test_sendrecv_kernels_take_their_host_ops_collective(tmp_path, reader):
    """NCCL runs these collectives as SendRecv kernels: each takes op, size, group, Seq and axis from
    the host op that launched it; a SendRecv with no host op is p2p of unknown axis, never CP ring."""
    e = [ev("ProfilerStep#1", 0, 10_000, HOST, "user_annotation")]
    for k, (op, host, desc) in enumerate([("all_to_all", "nccl:all_to_all", "undefined"),
                                          ("reduce_scatter", "nccl:reduce_scatter", "undefined"),
                                          ("allreduce", "nccl:all_reduce", "tp_group"),
                                          ("all_gather", "nccl:all_gather", "undefined")]):
        t0 = 1000 * (k + 1)
        e += [rpc(t0, 200, op, 1024 * (k + 1), pg_desc=desc, seq=10 + k), ev(host, t0 + 10, 150, HOST, "user_annotation")]
        e += launched(SENDRECV, t0 + 300, 100, corr=100 + k, launch_ts=t0 + 20)
    e += launched(SENDRECV, 6000, 100, corr=200, launch_ts=5900)  # no host op around its launch
    e += [ev(SENDRECV, 7000, 100, SIDE, "kernel", correlation=999)]  # its launch is not in the trace
    got, links = kernel_classes(write(tmp_path / "t.json.gz", e))
    want = [
        (SENDRECV, "ep_all_to_all", "all_to_all", "ep", "inferred", 4096.0, "3", 10),
        (SENDRECV, "other_comm", "reduce_scatter", "other", "unknown", 8192.0, "3", 11),
        (SENDRECV, "tp_allreduce", "allreduce", "tp", "declared", 12288.0, "3", 12),
        (SENDRECV, "other_comm", "all_gather", "other", "unknown", 16384.0, "3", 13),
        (SENDRECV, "other_comm", "send_recv", "other", "unknown", float("nan"), None, -1),
        (SENDRECV, "other_comm", "send_recv", "other", "unknown", float("nan"), None, -1),
    ]
    assert [g[:5] for g in got] == [w[:5] for w in want]
    assert [g[6:] for g in got] == [w[6:] for w in want]
    assert [g[5] for g in got[:4]] == [w[5] for w in want[:4]]
    assert links == {"comm_kernels": 6, "linked": 4, "no_launch": 1, "outside_host_op": 1, "no_correlation": 0,
                     "graph_replays": 0}
    r = analyze(tmp_path / "t.json.gz")
    assert r["phases"]["step"]["exposed_share"]["cp_ring"] == 0
    assert r["kernel_links"]["linked"] == 4
    assert not any("pass-KV" in x for x in r["phases"]["step"]["recommendations"])


def test_sizes_carried_only_by_host_inputs(tmp_path, reader):
    """Older PyTorch: `nccl:all_to_all` records only its input's dims and type; the size comes from them."""
    e = [ev("record_param_comms", 100, 300, HOST, **{"Input Dims": [[6144], [], []], "Input type": ["float", "Scalar", ""]}),
         ev("nccl:all_to_all", 110, 200, HOST, "user_annotation", **{"Input Dims": [[6144]], "Input type": ["float"]})]
    e += launched("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", 500, 50,
                  corr=7, launch_ts=150)
    got, _ = kernel_classes(write(tmp_path / "t.json.gz", e))
    assert [(g[1], g[2], g[5]) for g in got] == [("ep_all_to_all", "all_to_all", 6144 * 4.0)]


def test_gradient_hook_allreduce_is_data_parallel(tmp_path, reader):
    """An allreduce fired from the gradient-ready hook (DDP) synchronises gradients: DP, not TP."""
    hook = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
    e = [ev(hook, 0, 1000, HOST), ev("c10d::allreduce_", 100, 300, HOST), ev("nccl:all_reduce", 120, 200, HOST)]
    e += launched("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", 400, 80, corr=3,
                  launch_ts=150)
    got, _ = kernel_classes(write(tmp_path / "t.json.gz", e))
    assert [(g[1], g[2], g[3], g[4]) for g in got] == [("other_comm", "allreduce", "dp", "inferred")]


def _engine_steps():
    """vLLM v1 steps (gpu_worker.py annotate_profile): prefill, 3 decodes, mixed; a TP allreduce in each."""
    steps = [("execute_context_1(512)_generation_0(0)", 0, 2000), ("execute_context_0(0)_generation_4(4)", 3000, 500),
             ("execute_context_0(0)_generation_4(4)", 4000, 500), ("execute_context_0(0)_generation_4(4)", 5000, 500),
             ("execute_context_1(128)_generation_3(3)", 6000, 1000)]
    e, corr = [ev("execute_context_x(1)", 8000, 10, HOST, "user_annotation")], 1  # malformed: counted, not used
    for name, t0, dur in steps:
        e.append(ev(name, t0, dur, HOST, "user_annotation"))
        e.append(ev("gemm_kernel", t0 + 10, dur // 2, STREAM, "kernel"))
        e.append(ev("nccl:all_reduce", t0 + 20, 30, HOST, "user_annotation"))
        e.append(rpc(t0 + 15, 40, "allreduce", 4096, pg_desc="tp", seq=corr))
        e += launched("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                      t0 + 10 + dur // 2, 100, corr=corr, launch_ts=t0 + 25)
        corr += 1
    return e


def test_vllm_engine_steps_are_phases(tmp_path, reader):
    r = analyze(write(tmp_path / "t.json.gz", _engine_steps()))
    rk = r["ranks"][0]
    assert rk["phase_rule"]["rule"] == "vllm-v1" and rk["phase_rule"]["malformed"] == 1
    assert "vllm/v1/worker/gpu_worker.py" in rk["phase_rule"]["source"]
    assert rk["phase_rule"]["engine_steps"] == {
        "prefill": {"steps": 1, "context_requests": 1, "context_tokens": 512, "generation_requests": 0,
                    "generation_tokens": 0},
        "decode": {"steps": 3, "context_requests": 0, "context_tokens": 0, "generation_requests": 12,
                   "generation_tokens": 12},
        "mixed": {"steps": 1, "context_requests": 1, "context_tokens": 128, "generation_requests": 3,
                  "generation_tokens": 3}}
    ph = rk["phases"]
    assert (ph["prefill"]["e2e_us"], ph["decode"]["e2e_us"], ph["mixed"]["e2e_us"]) == (2000, 1500, 1000)
    # each step: compute [t0+10, t0+10+dur/2], then the allreduce, 100 µs, not overlapped
    for p in ("prefill", "decode", "mixed"):
        cats = ph[p]["categories"]
        assert cats["tp_allreduce"]["exposed_us"] == 100 * ph[p]["windows"]
        assert cats["compute"]["exposed_us"] == {"prefill": 1000, "decode": 750, "mixed": 500}[p]
    assert r["axis_provenance"] == {"tp_allreduce": {"declared": 5}}


def test_graph_replayed_decode_is_attributed_and_no_graph_advice(tmp_path, reader):
    """Decode as graph replays: kernels tied to cudaGraphLaunch by correlation count like any other;
    a device idle between replays is not 'capture the step in a graph'."""
    e = []
    for i in range(4):
        t0 = 1000 * i
        e.append(ev("ProfilerStep#%d" % i, t0, 1000, HOST, "user_annotation"))
        e += launched("gemm_kernel", t0 + 100, 200, corr=50 + i, launch_ts=t0 + 10, stream=STREAM, api="cudaGraphLaunch")
        e.append(ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", t0 + 300, 100,
                    SIDE, "kernel", correlation=50 + i))
    r = analyze(write(tmp_path / "t.json.gz", e))
    p = r["phases"]["step"]
    assert r["graphs"]["0"]["state"] == "replays" and r["graphs"]["0"]["launches"] == 4
    assert r["ranks"][0]["phases"]["step"]["categories"]["tp_allreduce"]["exposed_us"] == 400
    assert p["verdict"] == "host/launch-bound"  # idle 70 %: but the step already replays a graph
    assert not any("capture the step" in x for x in p["recommendations"])
    assert any("replays CUDA/HIP graphs" in x for x in p["recommendations"])
    assert r["kernel_links"]["graph_replays"] == 4


def test_capture_only_and_replays_without_kernels_give_no_verdict(tmp_path, reader):
    cap = [ev("cudaStreamBeginCapture", 0, 5, HOST, "cuda_runtime"), ev("cudaGraphInstantiate", 10, 500, HOST, "cuda_runtime"),
           ev("gemm_kernel", 20, 50, STREAM, "kernel")]
    r = analyze(write(tmp_path / "cap.json.gz", cap))
    p = r["phases"]["trace"]
    assert p["verdict"] == "unknown" and "capture but no replay" in p["notes"][0] and not p["recommendations"]
    blind = [ev("ProfilerStep#1", 0, 4000, HOST, "user_annotation"), ev("gemm_kernel", 10, 50, STREAM, "kernel")]
    blind += [ev("cudaGraphLaunch", 100 + 1000 * i, 5, HOST, "cuda_runtime", correlation=i) for i in range(3)]
    r = analyze(write(tmp_path / "blind.json.gz", blind))
    p = r["phases"]["step"]
    assert r["graphs"]["0"]["state"] == "replays-without-kernels" and r["graphs"]["0"]["empty_replays"] == 3
    assert p["verdict"] == "unknown" and "not the kernels they ran" in p["notes"][0]


def test_renamed_deepep_kernels_on_a_side_stream(tmp_path, reader):
    """A fork's DeepEP kernels in another namespace are EP all-to-all; the layout kernel is compute;
    exposed is what compute on the other stream does not cover."""
    e = [ev("ProfilerStep#1", 0, 1000, HOST, "user_annotation"),
         ev("void myco::ep::get_dispatch_layout<128>(long const*, int*)", 0, 20, STREAM, "kernel"),
         ev("void myco::ep::internode::notify_dispatch<8>(int const*, int*)", 20, 30, SIDE, "kernel"),
         ev("void myco::ep::internode::dispatch<false, 8, 32>(int4*, float*)", 50, 200, SIDE, "kernel"),
         ev("void myco::ep::internode::combine<8>(int4*, float*)", 600, 100, SIDE, "kernel"),
         ev("gemm_kernel", 100, 550, STREAM, "kernel")]
    r = analyze(write(tmp_path / "t.json.gz", e))
    cats = r["ranks"][0]["phases"]["step"]["categories"]
    # EP kernels cover [20, 250] and [600, 700]; compute covers [0, 20] and [100, 650]
    assert cats["ep_all_to_all"]["total_us"] == 330 and cats["ep_all_to_all"]["exposed_us"] == 80 + 50
    assert cats["compute"]["total_us"] == 570
    assert r["axis_provenance"] == {"ep_all_to_all": {"inferred": 3}}


DLRM_SIZES = {"all_to_all": sorted([24576.0, 192.0, 1536.0, 13568.0, 24576.0]),
              "allreduce": sorted([1576964.0, 448.0, 907840.0])}


def test_real_dlrm_set_is_all_to_all_and_ddp_allreduce(real_traces):
    """8 ranks of a real DLRM step: 5 SendRecv kernels launched by nccl:all_to_all and 3 AllReduce by
    nccl:all_reduce per rank (all in DDP's gradient hook), never CP ring; rank 7 arrives last in 5
    of the 8 collectives (counted from the raw kernels' start times)."""
    d = real_traces / "facebookresearch-param"
    for f in sorted(d.glob("*.json.gz")):
        got, links = kernel_classes(f)
        assert links["linked"] == 8 == links["comm_kernels"]
        by_op = {}
        for g in got:
            by_op.setdefault(g[2], []).append(g)
        assert {op: sorted(x[5] for x in v) for op, v in by_op.items()} == DLRM_SIZES
        assert {(x[1], x[3], x[4]) for x in by_op["all_to_all"]} == {("ep_all_to_all", "ep", "inferred")}
        assert {(x[1], x[3], x[4]) for x in by_op["allreduce"]} == {("other_comm", "dp", "inferred")}
    r = analyze(d)
    assert r["collectives"]["matched_calls"] == 8 and r["collectives"]["straggler"] == 7
    assert [x["times_last"] for x in r["collectives"]["ranks"]] == [0, 0, 0, 0, 1, 2, 0, 5]
    # torch of 2023 records no group size: 8 ranks' calls were taken as one group, and the result says so
    assert r["collectives"]["group_rule"].startswith("8 of 8 matched call(s) record no group size")
    assert r["phases"]["step"]["exposed_share"]["cp_ring"] == 0 and r["phases"]["step"]["exposed_share"]["tp_allreduce"] == 0
    assert not any("pass-KV" in x or "DDA" in x for x in r["phases"]["step"]["recommendations"])


def test_sglang_step_spans_are_phases(tmp_path, reader):
    """SGLang's ModelRunner.forward spans (model_runner.py _build_step_span_name): prefill, decode,
    mixed and other modes; extra roofline fields allowed; a malformed one counted."""
    steps = [("step[prefill bs=2 toks=300]", 0, 1000), ("step[decode bs=2]", 2000, 200), ("step[decode bs=2 sk=310]", 3000, 200),
             ("step[mixed bs=3 ext=50 dec=2]", 4000, 400), ("step[TARGET_VERIFY bs=2]", 5000, 100), ("step[idle]", 6000, 50)]
    e = [ev("step[decode bs=two]", 7000, 10, HOST, "user_annotation")]
    for name, t0, dur in steps:
        e += [ev(name, t0, dur, HOST, "user_annotation"), ev("gemm_kernel", t0, dur // 2, STREAM, "kernel")]
    r = analyze(write(tmp_path / "t.json.gz", e))
    rule = r["ranks"][0]["phase_rule"]
    assert rule["rule"] == "sglang" and rule["malformed"] == 1 and "model_runner.py" in rule["source"]
    assert rule["engine_steps"] == {"prefill": {"steps": 1, "requests": 2, "prefill_tokens": 300},
                                    "decode": {"steps": 2, "requests": 4},
                                    "mixed": {"steps": 1, "requests": 3, "prefill_tokens": 50, "decode_tokens": 2},
                                    "target_verify": {"steps": 1, "requests": 2}, "idle-step": {"steps": 1}}
    ph = r["ranks"][0]["phases"]
    assert {p: ph[p]["e2e_us"] for p in ph} == {"prefill": 1000, "decode": 400, "mixed": 400, "target_verify": 100,
                                                "idle-step": 50}
    assert ph["decode"]["categories"]["compute"]["exposed_us"] == 200


def test_tensorrt_llm_forward_steps_are_phases(tmp_path, reader):
    """TensorRT-LLM's py_executor.py `_forward_step` range, with and without the iteration."""
    steps = [("[Executor] _forward_step 1: 2 ctx reqs, 0 gen reqs", 0, 800), ("[Executor] _forward_step 2: 0 ctx reqs, 2 gen reqs", 1000, 100),
             ("_forward_step: 1 ctx reqs, 1 gen reqs", 2000, 300)]
    e = [ev(n, t0, d, HOST, "user_annotation") for n, t0, d in steps] + [ev("gemm_kernel", 0, 50, STREAM, "kernel")]
    r = analyze(write(tmp_path / "t.json.gz", e))
    rule = r["ranks"][0]["phase_rule"]
    assert rule["rule"] == "trtllm" and "py_executor.py" in rule["source"]
    assert {p: v["e2e_us"] for p, v in r["ranks"][0]["phases"].items()} == {"prefill": 800, "decode": 100, "mixed": 300}
    assert rule["engine_steps"]["mixed"] == {"steps": 1, "context_requests": 1, "generation_requests": 1}


def test_a_vllm_profile_directory_with_its_front_end_trace(tmp_path):
    """vLLM (>= 0.16, `--profiler-config`) writes the API server's own trace beside the workers'
    (`<prefix>_<host>_<pid>.async_llm.<id>.pt.trace.json.gz`: no rank, no device work); it used to
    collide with rank 0 ("rank 0 appears in more than one file"). Workers are named by their
    coordinates (`dp0_pp0_tp{t}_dcp0_ep0_rank{r}`, vllm/distributed/utils.py)."""
    import gzip
    import json

    from tests.kineto_events import kernel

    d = tmp_path / "vllm_profile"
    d.mkdir()
    for r in (0, 1):
        write(d / f"dp0_pp0_tp{r}_dcp0_ep0_rank{r}_host_{100 + r}.pt.trace.json.gz",
              [ev("execute_context_1(16)_generation_0(0)", 0, 500, HOST, "user_annotation"), kernel("gemm", 10, 400)],
              rank=r, world=2)
    front = d / "vllm_host_99.async_llm.1733000000.pt.trace.json.gz"
    with gzip.open(front, "wt") as f:  # the front end's trace: host events only, no distributedInfo
        json.dump({"traceEvents": [ev("AsyncLLM.generate", 0, 900, HOST, "user_annotation")]}, f)
    r = analyze(d)
    assert [x["rank"] for x in r["ranks"]] == [0, 1]
    assert r["source"]["skipped"] == [{"file": str(front), "why": "an engine's front-end process (vLLM API server): "
                                                                  "no rank, no device work"}]
    assert any("front-end trace(s) kept apart" in n for n in r["source"]["reader_notes"])
