"""A step's device window joins its host range with the device work it launched (by
correlation), tiled so no time counts twice; never its GPU-side marker alone. Truth here is computed from the raw JSON by this file's own
few lines (json + gzip), never from the analyzer; the traces are real (tests/data/traces)."""

from __future__ import annotations

import gzip
import json

import pytest

from commprobe.analyzers.analysis import analyze
from tests.kineto_events import HOST, launched, ev, write

_DEV = {"kernel", "gpu_memcpy", "gpu_memset"}


def truth(path) -> dict:
    """Per host ProfilerStep#N (in start order): its host range joined with the span of the device
    events whose correlation id is that of a runtime call starting inside the range, each window
    starting no earlier than the previous one ends; the steps that launched nothing; the share of
    launched time after its host range, and outside the GPU-side ProfilerStep markers."""
    doc = json.load(gzip.open(path))
    xs = [e for e in (doc["traceEvents"] if isinstance(doc, dict) else doc) if e.get("ph") == "X"]
    calls = [e for e in xs if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})]
    work: dict[int, list] = {}
    for e in xs:
        if e.get("cat") in _DEV and "correlation" in e.get("args", {}):
            work.setdefault(e["args"]["correlation"], []).append(e)
    steps = sorted((e for e in xs if e["name"].startswith("ProfilerStep#") and e["cat"] == "user_annotation"),
                   key=lambda e: e["ts"])
    marks = [e for e in xs if e["name"].startswith("ProfilerStep#") and e["cat"] == "gpu_user_annotation"]
    # work launched before the trace began (its id below every launch the trace holds) is no step's:
    # the first window starts once the device is done with it, at the latest at its own first work
    first_id = min(c["args"]["correlation"] for c in calls)
    pre = [k for ks in work.values() for k in ks if k["args"]["correlation"] < first_id]
    spans, empty, busy, outside, after = [], 0, 0.0, 0.0, 0.0
    for s in steps:
        lo, hi = s["ts"], s["ts"] + s["dur"]
        mine = [k for c in calls if lo <= c["ts"] <= hi for k in work.get(c["args"]["correlation"], [])]
        empty += not mine
        a, b = min([lo] + [k["ts"] for k in mine]), max([hi] + [k["ts"] + k["dur"] for k in mine])
        if spans:
            a = max(a, max(e for _, e in spans))
        elif pre:
            a = max(a, min(max(k["ts"] + k["dur"] for k in pre), min([k["ts"] for k in mine] or [hi])))
        spans.append((a, max(a, b)))
        for k in mine:
            inside = sum(max(0.0, min(k["ts"] + k["dur"], m["ts"] + m["dur"]) - max(k["ts"], m["ts"])) for m in marks)
            busy, outside = busy + k["dur"], outside + k["dur"] - inside
            after += max(0.0, k["ts"] + k["dur"] - max(k["ts"], hi))
    call_ts = {c["args"]["correlation"]: c["ts"] for c in calls}
    dev = [k for ks in work.values() for k in ks]
    no_launch = sum(k["args"]["correlation"] not in call_ts for k in dev) - len(pre)
    between = sum(k["args"]["correlation"] in call_ts and not any(
        s["ts"] <= call_ts[k["args"]["correlation"]] <= s["ts"] + s["dur"] for s in steps) for k in dev)
    return {"spans": spans, "empty": empty, "outside_pct": 100 * outside / busy if marks and busy else None,
            "after_pct": 100 * after / busy if busy else 0.0, "launched": len(dev) - no_launch - between - len(pre),
            "no_launch": no_launch, "between": between, "pre_trace": len(pre)}


def _same_spans(got: list, want: list) -> None:
    """Equal durations and equal offsets from the first window (the analyzer's clock starts at
    the trace's base, the raw one at the epoch)."""
    assert len(got) == len(want)
    assert [b - a for a, b in got] == pytest.approx([b - a for a, b in want], abs=1e-3)
    assert [a - got[0][0] for a, _ in got] == pytest.approx([a - want[0][0] for a, _ in want], abs=1e-2)


@pytest.mark.parametrize("name", ["hta/amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz",
                                  "hta/nccl_parser_config_nccl_data.json.gz",
                                  "hta/trace_filter_sampled_rank-1.json.gz",
                                  "facebookresearch-param/worker3_step_12.1694128201557.pt.trace.json.gz"])
def test_real_step_windows_span_the_work_each_step_launched(real_traces, name):
    path = real_traces / name
    want = truth(path)
    r = analyze(path)["ranks"][0]
    rule = r["phase_rule"]
    assert rule["rule"] == "profiler-step" and rule["windows_from"] == "launched work"
    assert rule["steps_without_device_work"] == want["empty"]
    assert rule["launched_after_host_range_pct"] == pytest.approx(want["after_pct"], abs=1e-6)
    assert (rule["launched_events"], rule["device_work_without_launch"], rule["device_work_outside_steps"],
            rule["device_work_launched_before_the_trace"]) == \
        (want["launched"], want["no_launch"], want["between"], want["pre_trace"])
    _same_spans(r["windows"]["step"], want["spans"])
    assert r["phases"]["step"]["e2e_us"] == pytest.approx(sum(b - a for a, b in want["spans"]), abs=1e-2)
    if want["outside_pct"] is None:
        assert "device_markers" not in rule
    else:  # the MI250 marker: 1.03 ms long for 8.9 ms of launched work, 38 % of its busy time outside
        assert rule["device_markers"]["launched_outside_pct"] == pytest.approx(want["outside_pct"], abs=0.01)


def test_mi250_marker_misses_launched_work_and_the_window_does_not(real_traces):
    """The case that sent an engineer the wrong way: the GPU-side marker is 1,031 µs long; the
    step's launched work runs 8,912 µs inside its 9,288 µs host range. The window is the latter
    (the second step launched nothing: its host range, counted)."""
    path = real_traces / "hta/amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    r = analyze(path)["ranks"][0]
    (a, b), _ = sorted(r["windows"]["step"])
    assert b - a == pytest.approx(9288.3, abs=0.1)
    assert r["phase_rule"]["device_markers"]["launched_outside_pct"] == pytest.approx(38.2, abs=0.05)


def test_cpu_only_trace_keeps_host_ranges(real_traces):
    r = analyze(real_traces / "hta/cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")["ranks"][0]
    assert r["phase_rule"]["windows_from"] == "host ranges"


def _step(tmp_path, marker: bool, corr: bool = True):
    """One decode step: the host range is 0-100 µs; the main thread launches an allreduce kernel
    (200-700 µs) and the autograd thread a matmul (700-1,700 µs) that runs long after the range
    ends; a GPU-side copy of the annotation covers 200-300 µs only."""
    events = [ev("commprobe/decode[0]", 0, 100, HOST, "user_annotation"),
              *launched("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 200, 500, 1, 10),
              *launched("sm90_xmma_gemm", 700, 1000, 2, 60, stream=7),
              ev("commprobe/decode[0]", 10_000, 50, HOST, "user_annotation"),  # launches nothing
              ev("ProfilerStep#9", 10_000, 50, HOST, "user_annotation")]
    events[4]["tid"] = "autograd"  # the matmul's launch: another thread of the process
    if marker:
        events.append(ev("commprobe/decode[0]", 200, 100, 7, "gpu_user_annotation"))
    if not corr:
        for e in events:
            e["args"].pop("correlation", None)
    return write(tmp_path / "t.json.gz", events)


def test_work_launched_from_another_thread_and_running_past_the_range_is_the_steps(tmp_path):
    r = analyze(_step(tmp_path, marker=True))["ranks"][0]
    assert r["windows"]["decode"] == [[0.0, 1700.0], [10_000.0, 10_050.0]]
    rule = r["phase_rule"]
    assert rule["windows_from"] == "launched work" and rule["steps_without_device_work"] == 1
    # launched 1,500 µs of work, all after the host range; the marker (200-300) covers 100 of it
    assert rule["device_markers"] == {"markers": 1, "launched_outside_pct": pytest.approx(100 * 1400 / 1500)}
    assert rule["launched_after_host_range_pct"] == pytest.approx(100.0)
    assert rule["launched_outside_own_window_pct"] == 0.0
    dec = r["phases"]["decode"]
    assert dec["e2e_us"] == pytest.approx(1750) and dec["categories"]["compute"]["total_us"] == pytest.approx(1000)
    assert dec["idle_us"] == pytest.approx(1750 - 1500)


def test_a_host_running_a_step_ahead_counts_no_time_twice(tmp_path):
    """Step 2's host range starts while step 1's kernel still runs: step 2's window starts where
    step 1's ends, and its own kernel (queued behind) lies inside it."""
    events = [ev("ProfilerStep#1", 0, 100, HOST, "user_annotation"), *launched("gemm", 50, 1000, 1, 10, stream=7),
              ev("ProfilerStep#2", 100, 100, HOST, "user_annotation"), *launched("gemm", 1050, 1000, 2, 110, stream=7)]
    r = analyze(write(tmp_path / "t.json.gz", events))["ranks"][0]
    assert r["windows"]["step"] == [[0.0, 1050.0], [1050.0, 2050.0]]
    assert r["phases"]["step"]["e2e_us"] == pytest.approx(2050) and r["phases"]["step"]["idle_us"] == pytest.approx(50)
    assert r["phase_rule"]["launched_outside_own_window_pct"] == 0.0


def test_work_launched_between_steps_or_by_no_call_in_the_trace_is_counted_not_placed(tmp_path):
    events = [ev("ProfilerStep#1", 0, 100, HOST, "user_annotation"), *launched("gemm", 50, 100, 1, 10, stream=7),
              *launched("gemm", 300, 100, 2, 200, stream=7),  # launched between steps
              ev("gemm", 500, 100, 7, "kernel", correlation=99)]  # its cudaLaunchKernel is not in the trace
    rule = analyze(write(tmp_path / "t.json.gz", events))["ranks"][0]["phase_rule"]
    assert (rule["launched_events"], rule["device_work_outside_steps"], rule["device_work_without_launch"]) == (1, 1, 1)


def test_without_correlation_the_gpu_marker_is_used_and_said(tmp_path):
    r = analyze(_step(tmp_path, marker=True, corr=False))["ranks"][0]
    assert r["phase_rule"]["windows_from"] == "device markers" and r["windows"]["decode"] == [[200.0, 300.0]]


def test_without_correlation_or_marker_the_host_range_is_used_and_said(tmp_path):
    r = analyze(_step(tmp_path, marker=False, corr=False))["ranks"][0]
    assert r["phase_rule"]["windows_from"] == "host ranges"
    assert r["windows"]["decode"] == [[0.0, 100.0], [10_000.0, 10_050.0]]


def test_work_launched_before_the_first_step_is_counted_apart_never_in_step_1(tmp_path):
    """A GPU far behind the host: two kernels launched before ProfilerStep#1 (warm-up, 600 µs) still
    run during step 1's host range. They belong to no step: counted (events, µs), and step 1's
    window starts when the device is done with them (issue 56: the real MI300X trace's first step
    read 49 ms against 19 ms by launch), so its compute is only its own 100 µs kernel."""
    events = [*launched("warmup_gemm", 1000, 300, 1, launch_ts=10, stream=7),
              *launched("warmup_gemm", 1300, 300, 2, launch_ts=20, stream=7),
              ev("ProfilerStep#1", 900, 200, HOST, "user_annotation"),
              *launched("step_gemm", 1600, 100, 3, launch_ts=950, stream=7)]
    a = analyze(write(tmp_path / "t.json.gz", events))
    rk = a["ranks"][0]
    rule = rk["phase_rule"]
    assert rule["device_work_before_first_step"] == {"events": 2, "us": 600.0}
    assert rule["device_work_after_last_step"] == {"events": 0, "us": 0.0}
    cats = rk["phases"]["step"]["categories"]
    assert cats["compute"]["total_us"] == pytest.approx(100.0)  # the step's own kernel only
    assert rk["phases"]["step"]["e2e_us"] == pytest.approx(1700 - 1600)  # from the earlier work's end to its own
    assert rule["busy_in_windows_pct"] == pytest.approx(100.0)  # work of no step is not the breakdown's busy time


def test_short_markers_are_step_boundaries(tmp_path):
    """ProfilerStep#N markers of 2 µs with the step's work between them (a torch.profiler export
    written without Kineto; torch 2.13 writes Kineto even with use_kineto=False, so built here):
    each step runs from its marker to the next, the last to the end of the recorded work; the
    host ops inside are the step's (before: windows of 2 µs, 'compute-bound, compute 0 %')."""
    events = []
    for k in range(3):
        t = 1000 * k
        events += [ev(f"ProfilerStep#{k}", t, 2, HOST, "user_annotation"), ev("aten::mm", t + 10, 700, HOST),
                   ev("aten::relu", t + 720, 100, HOST)]
    a = analyze(write(tmp_path / "t.json.gz", events))
    rk = a["ranks"][0]
    assert rk["phase_rule"]["markers_as_boundaries"]["markers"] == 3
    assert rk["windows"]["step"] == [[0.0, 1000.0], [1000.0, 2000.0], [2000.0, 2820.0]]
    cats = rk["phases"]["step"]["categories"]
    assert cats["compute"]["total_us"] == pytest.approx(3 * 800)
    assert rk["phase_rule"]["busy_in_windows_pct"] == pytest.approx(100.0)
