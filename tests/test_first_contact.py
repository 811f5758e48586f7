"""First contact, second round (issue 49): four classes of wrong answer, each on a built trace of its
shape and on a real producer run here. Every truth is computed from the raw events by the test,
never read from the analyzer.

1. The straggler agrees with the waits: who arrived last is read from one time (the ranks' starts
   on one clock, else their time in each call), and the waits from the same time.
2. A device used but not recorded is not a CPU workload: its verdict is `unknown`, saying what is
   missing and how to record it.
3. Step boundaries from few markers: markers that hold no work bound the steps, whatever their count.
4. (tests/test_hostile_readers.py) SQLite queries against a deadline; --rank-from groups of other digits.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from commprobe.analyzers.analysis import analyze
from tests.conftest import ROOT, invariant_violations
from tests.kineto_events import launched, rpc, write

# --- 1. the straggler the waits point to ------------------------------------------------------


def _three_hosts(out: Path) -> Path:
    """Nine ranks on three hosts, two NCCL allreduces each, no compute (the multi-node Nsight
    collection's shape): nodea arrives at 0 ms, nodeb at 20, nodec at 22.5 (true time); every call
    ends at 34.5 ms. Each host's clock is its own: nodeb's runs 5 ms ahead, nodec's 1 ms behind, so
    on the raw clocks nodeb's ranks seem to enter last."""
    out.mkdir()
    hosts = {"nodea": (0.0, 0.0), "nodeb": (20.0, 5.0), "nodec": (22.5, -1.0)}
    rank = 0
    for host, (arrive_ms, skew_ms) in hosts.items():
        for local in range(3):
            evs = []
            for call in range(2):
                t0 = call * 100_000 + (arrive_ms + skew_ms) * 1000 + local * 100
                end = call * 100_000 + (34.5 + skew_ms) * 1000
                evs.append(rpc(t0 - 50, 30, "allreduce", 1 << 20, group="0", group_size=9, seq=call))
                evs += launched("ncclDevKernel_AllReduce_Sum_f32_RING_LL", t0, end - t0, corr=100 + call,
                                launch_ts=t0 - 40)
            write(out / f"{host}_{local}.json.gz", evs, rank=rank, world=9)
            rank += 1
    return out


def _kernel_spans(path: Path) -> list[tuple[float, float]]:
    doc = json.load(gzip.open(path))
    return sorted((e["ts"], e["dur"]) for e in doc["traceEvents"] if e.get("cat") == "kernel")


def test_on_three_hosts_the_last_arriver_is_the_rank_that_waited_least(tmp_path):
    d = _three_hosts(tmp_path / "nsight-like")
    files = sorted(d.glob("*.json.gz"))
    spans = {r: _kernel_spans(f) for r, f in enumerate(files)}
    # the truth from the raw events: the calls end together, so the shortest kernel arrived last
    shortest = {min(spans, key=lambda r: spans[r][k][1]) for k in range(2)}
    latest_start = {max(spans, key=lambda r: spans[r][k][0]) for k in range(2)}
    assert shortest == {8} and latest_start == {5}  # the raw clocks would name nodeb's rank 5
    a = analyze(d)
    coll = a["collectives"]
    assert coll["arrival_rule"] == "durations" and "ranks on 3 hosts" in coll["arrival_rule_why"]
    assert coll["straggler"] == 8
    rows = {r["rank"]: r for r in coll["ranks"]}
    assert rows[8]["times_last"] == 2 and rows[8]["wait_us"] == 0
    for r in range(9):  # each rank's waiting: its kernel's time beyond the last arriver's, per call
        want = sum(spans[r][k][1] - spans[8][k][1] for k in range(2))
        assert rows[r]["wait_us"] == pytest.approx(want, abs=1e-6)
        assert rows[r]["held_us"] == 0 and rows[r]["carried_us"] == 0  # several clocks: not told
    assert a["phases"]["trace"]["communication_cause"]["culprit"] == 8
    assert invariant_violations(a, source=d) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def late_agent(tmp_path_factory) -> Path:
    """A real two-agent torchrun job on one machine (two "nodes" on 127.0.0.1, two gloo workers
    each, tests/training_jobs.py late-agent): the second agent's ranks sleep before every allreduce."""
    d = tmp_path_factory.mktemp("late-agent")
    port = _free_port()
    job = str(ROOT / "tests" / "training_jobs.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "commprobe-late",
           "--local-addr", "127.0.0.1", job, "late-agent", "0", str(d)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in (0, 1)]
    for p in procs:
        try:
            log, _ = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("late-agent: torchrun did not finish in 180 s")
        assert p.returncode == 0, log[-2000:]
    return d


def _workers(d: Path) -> dict[int, dict]:
    """pid -> what torchrun told that worker (RANK, GROUP_RANK)."""
    return {int(p.stem): json.loads(p.read_text()) for p in (d / "workers").glob("*.json")}


def _allreduce_starts(d: Path, pattern: str = "*.pt.trace.json") -> dict[int, list[tuple[float, float]]]:
    """rank -> (start, end) of its c10d::allreduce_ calls in order, on each trace's own clock (µs)."""
    out = {}
    for f in d.glob(pattern):
        doc = json.loads(f.read_text())
        evs = sorted((e["ts"], e["ts"] + e["dur"]) for e in doc["traceEvents"]
                     if e.get("ph") == "X" and e.get("name") == "c10d::allreduce_")
        out[doc["distributedInfo"]["rank"]] = evs
    return out


def _late_ranks(d: Path) -> set[int]:
    return {int(w["RANK"]) for w in _workers(d).values() if w["GROUP_RANK"] == "1"}


def test_a_late_torchrun_agent_is_named_on_one_clock(late_agent):
    late = _late_ranks(late_agent)
    assert len(late) == 2
    starts = _allreduce_starts(late_agent)
    n = min(len(v) for v in starts.values())
    assert n == 12  # four allreduces in each of three steps
    last = [max(starts, key=lambda r: starts[r][k][0]) for k in range(n)]
    assert sum(r in late for r in last) >= n - 1  # the raw events: the late agent enters last
    a = analyze(late_agent)
    coll = a["collectives"]
    assert coll["arrival_rule"] == "clock" and "one host" in coll["arrival_rule_why"]
    rows = {r["rank"]: r for r in coll["ranks"]}
    # the late agent's two ranks take turns arriving last: one is named only where it caused 75 % of
    # the waiting (issue 56: one straggler rule); whoever caused most is on the late agent
    assert coll["straggler"] in late | {None} and coll["straggler_rule"]["most_waiting_caused_by"] in late
    assert sum(rows[r]["times_last"] for r in late) >= 0.9 * coll["matched_calls"]
    assert invariant_violations(a, source=late_agent) == []
    assert all(p["verdict"] != "unknown" for p in a["phases"].values())  # gloo: a CPU workload keeps its verdict
    assert all(r["device_missing"] is None for r in a["ranks"])


def test_a_late_torchrun_agent_is_named_when_its_host_has_another_clock(late_agent, tmp_path):
    """The same traces exported as two hosts would write them: each agent's `host_name` its own
    (read from the trace, not the file name), the late agent's clock 20 ms behind. On the raw
    clocks the late agent now seems to enter first; its time in each call still says it came last."""
    d = tmp_path / "two-hosts"
    d.mkdir()
    workers = _workers(late_agent)
    late = _late_ranks(late_agent)
    for f in late_agent.glob("*.pt.trace.json"):
        doc = json.loads(f.read_text())
        pid = int(re.match(r"^[^_]+_(\d+)\.", f.name).group(1))
        node = "nodeb" if workers[pid]["GROUP_RANK"] == "1" else "nodea"
        doc["host_name"] = node
        if node == "nodeb":
            doc["baseTimeNanoseconds"] -= 20_000_000
            for e in doc["traceEvents"]:
                if isinstance(e.get("ts"), (int, float)):
                    e["ts"] -= 20_000
        (d / f"trace{pid}.json").write_text(json.dumps(doc))
    starts = _allreduce_starts(d, "*.json")
    n = min(len(v) for v in starts.values())
    last_raw = [max(starts, key=lambda r: starts[r][k][0]) for k in range(n)]
    assert not any(r in late for r in last_raw)  # the raw clocks are fooled: agent 0 seems last
    a = analyze(d)
    assert {r["identity"]["host"] for r in a["ranks"]} == {"nodea", "nodeb"}  # Kineto's host_name, read
    coll = a["collectives"]
    assert coll["arrival_rule"] == "durations" and "ranks on 2 hosts" in coll["arrival_rule_why"]
    rows = {r["rank"]: r for r in coll["ranks"]}
    assert coll["straggler"] in late | {None} and coll["straggler_rule"]["most_waiting_caused_by"] in late
    # gloo's c10d::allreduce_ returns once the work is enqueued: its time in the call tells no arrival,
    # so the late agent is last at the collectives themselves (gloo:all_reduce), and causes the waiting
    assert sum(rows[r]["times_last"] for r in late) >= coll["matched_calls"] / 2
    caused = sum(r["caused_wait_us"] for r in rows.values())
    assert sum(rows[r]["caused_wait_us"] for r in late) >= 0.9 * caused
    assert invariant_violations(a, source=d) == []


def test_kinetos_host_name_is_read_by_both_readers(late_agent, tmp_path):
    from commprobe.analyzers.readers.kineto import load_trace

    f = next(late_agent.glob("*.pt.trace.json"))
    doc = json.loads(f.read_text())
    doc["host_name"] = "gpu-node-7"
    p = tmp_path / "renamed_by_hand.json"  # a name that says no host
    p.write_text(json.dumps(doc))
    assert load_trace(p).extra["identity"]["host"] == "gpu-node-7"
    code = ("import sys; from commprobe.analyzers.readers.kineto import load_trace; "
            "print(load_trace(sys.argv[1]).extra['identity']['host'])")
    r = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True,
                       env={**os.environ, "COMMPROBE_PURE_PYTHON": "1"}, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "gpu-node-7", r.stderr


# --- 2. a device used but not recorded --------------------------------------------------------

_DEVICE = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "Kernel", "Memcpy", "Memset"}
_LAUNCH_NAME = re.compile(r"^(?:cuda|cu|hip)\w*(?:Launch\w*|MemcpyAsync|MemsetAsync)$")


def test_launches_without_device_events_are_a_missing_device_timeline(real_traces, tmp_path):
    """The real DLRM set (8 V100 ranks, NCCL) with its device events stripped, as a profiler that
    recorded CPU activity only writes it: the launches and NCCL calls are still there, the device
    timeline is not. The verdict is unknown, saying what is missing and how to record it."""
    d = tmp_path / "no-device"
    d.mkdir()
    launches = {}
    for f in sorted((real_traces / "facebookresearch-param").glob("*.json.gz")):
        doc = json.load(gzip.open(f))
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in _DEVICE and e.get("cat") != "ac2g"]
        launches[doc["distributedInfo"]["rank"]] = sum(
            1 for e in doc["traceEvents"] if e.get("ph") == "X" and _LAUNCH_NAME.match(e.get("name", "")))
        with gzip.open(d / f.name, "wt") as w:
            json.dump(doc, w)
    assert min(launches.values()) > 100  # the raw events: every rank launched work
    a = analyze(d)
    for r in a["ranks"]:
        assert r["timeline"] == "host" and r["device_missing"]["launch_calls"] == launches[r["rank"]]
        assert r["device_missing"]["backend"] == "nccl" and r["device_missing"]["device_collective_calls"] > 0
    for ph, p in a["phases"].items():
        assert p["verdict"] == "unknown" and p["verdict_rule"]["name"] == "device timeline missing"
        assert "the device timeline is missing" in p["notes"][0] and "ProfilerActivity.CUDA" in p["notes"][0]
        assert f"{launches[0]:,} runtime launch calls" in p["notes"][0]
    assert invariant_violations(a, source=d) == []
    # the same set with its device events is analyzed as before
    full = analyze(real_traces / "facebookresearch-param")
    assert all(r["device_missing"] is None for r in full["ranks"])
    assert all(p["verdict"] != "unknown" for p in full["phases"].values())


def test_a_cpu_only_workload_keeps_its_verdict(real_traces):
    """HTA's real CPU-only trace (gloo, no launch, no NCCL) is a host workload, not a missing device."""
    a = analyze(real_traces / "hta" / "cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    assert a["ranks"][0]["device_missing"] is None
    assert all(p.get("verdict_rule", {}).get("name") != "device timeline missing" for p in a["phases"].values())


# --- 3. step boundaries from few markers ------------------------------------------------------

_STEPS_JOB = """
import sys, torch
from torch.autograd import profiler
torch.set_num_threads(1)
x = torch.randn(128, 128)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
    for i, n in enumerate(map(int, sys.argv[2].split(","))):
        with profiler.record_function(f"ProfilerStep#{i}"):
            pass
        for _ in range(n):
            y = torch.tanh(x @ x)
# a legacy export (EventList.export_chrome_trace: a bare list, "pid": "CPU functions", no cat) or Kineto's
(p.events() if sys.argv[3] == "legacy" else p).export_chrome_trace(sys.argv[1])
"""


def _marker_truth(path: Path) -> tuple[float, int]:
    """From the raw events: the time from each ProfilerStep marker to the next, the last to the end
    of the recorded work on the markers' thread; and the count of markers."""
    doc = json.loads(path.read_text())
    events = doc if isinstance(doc, list) else doc["traceEvents"]
    xs = [e for e in events if e.get("ph") == "X" and isinstance(e.get("dur"), (int, float))]
    marks = sorted((e["ts"], e["tid"]) for e in xs if e["name"].startswith("ProfilerStep#"))
    tid = marks[-1][1]
    end = max(e["ts"] + e["dur"] for e in xs if e["tid"] == tid and not e["name"].startswith("ProfilerStep#"))
    bounds = [m for m, _ in marks] + [end]
    return sum(b - a for a, b in zip(bounds, bounds[1:])), len(marks)


@pytest.mark.parametrize("steps,export", [("60,6,6", "kineto"), ("40", "kineto"), ("60,6,6", "legacy")])
def test_markers_that_hold_no_work_bound_the_steps(tmp_path, steps, export):
    """A real torch.profiler trace whose ProfilerStep# markers are empty record_functions (three,
    uneven; or one), in Kineto's format or the legacy export's: each step runs from its marker to
    the next, the last to the end of the work on the markers' thread; the windows hold all the work."""
    p = tmp_path / "steps.json"
    r = subprocess.run([sys.executable, "-c", _STEPS_JOB, str(p), steps, export], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    truth, markers = _marker_truth(p)
    a = analyze(p)
    rank = a["ranks"][0]
    rule = rank["phase_rule"]["markers_as_boundaries"]
    assert rule["markers"] == markers == len(steps.split(","))
    assert rule["evidence"] in ("hold no work", "short")
    assert rule["last_step_ends_at"] == "the end of the recorded work on the markers' thread"
    assert rank["phases"]["step"]["e2e_us"] == pytest.approx(truth, rel=1e-9)
    assert rank["phase_rule"]["busy_in_windows_pct"] > 99
    assert invariant_violations(a, p) == []


def test_three_short_markers_of_a_legacy_export_bound_three_steps(tmp_path):
    """The shape a legacy export of a DDP job writes: three ProfilerStep# ops of 17-18 µs, 36.4 and
    2.9 ms apart, work after the last for 2.8 ms: e2e is the 42.1 ms the markers bound."""
    evs, t = [], 1000.0
    for i, (dur, gap) in enumerate(((17.0, 36_400.0), (18.0, 2_900.0), (17.5, 2_800.0))):
        evs.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": t, "dur": dur, "pid": 1,
                    "tid": 1, "args": {}})
        k = t + 100.0
        while k + 500 <= t + gap:
            evs.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": k, "dur": 400.0, "pid": 1, "tid": 1,
                        "args": {}})
            k += 500.0
        t += gap
    p = write(tmp_path / "legacy.json.gz", evs, rank=None)
    end = max(e["ts"] + e["dur"] for e in evs)
    a = analyze(p)
    step = a["ranks"][0]["phases"]["step"]
    assert step["windows"] == 3
    assert step["e2e_us"] == pytest.approx(end - 1000.0)
    assert 41_500 < step["e2e_us"] <= 42_100  # 36.4 + 2.9 + 2.8 ms, less the last mm's tail
    assert invariant_violations(a, p) == []


def test_the_late_agent_bundle_shape_is_unchanged_by_the_boundary_rule(late_agent):
    """ProfilerStep ranges that hold their step's work stay ranges."""
    a = analyze(late_agent)
    for r in a["ranks"]:
        assert "markers_as_boundaries" not in r["phase_rule"]
        assert r["phase_rule"]["windows_from"] == "host ranges"


def test_device_work_that_seems_to_start_before_its_launch_does_not_pull_step_1_back(tmp_path):
    """A device clock 30 ms behind the host's (the shape of an MI300X RCCL trace): step 1's kernels
    seem to start before step 1 began launching them, over the work launched before it. By launch
    correlation each window is its host range joined with the end of its own work; the early
    starts are counted, not followed."""
    from tests.kineto_events import HOST, ev

    skew = -30_000.0
    events = [*launched("warmup_gemm", 5_000 + skew, 25_000, 1, launch_ts=1_000, stream=7)]
    corr = 10
    for k in range(3):
        h0 = 50_000 + k * 20_000
        events.append(ev(f"ProfilerStep#{k + 1}", h0, 20_000, HOST, "user_annotation"))
        for j in range(3):
            corr += 1
            events += launched("gemm", h0 + 2_000 + j * 5_000 + skew, 4_000, corr, launch_ts=h0 + 500 + j * 10,
                               stream=7)
    p = write(tmp_path / "skewed.json.gz", events, rank=None)
    # the truth from the raw events: per step, its host range, joined with the end of the work its calls launched
    doc = json.load(gzip.open(p))
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    calls = {e["args"]["correlation"]: e["ts"] for e in xs if e.get("cat") == "cuda_runtime"}
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in xs if e["name"].startswith("ProfilerStep#"))
    want = []
    for lo, hi in steps:
        mine = [e for e in xs if e.get("cat") == "kernel" and lo <= calls[e["args"]["correlation"]] <= hi]
        want.append((lo, max([hi] + [e["ts"] + e["dur"] for e in mine])))
    a = analyze(p)
    rank = a["ranks"][0]
    got = rank["windows"]["step"]
    assert [b - a_ for a_, b in got] == pytest.approx([b - a_ for a_, b in want])
    assert rank["phases"]["step"]["e2e_us"] == pytest.approx(sum(b - a_ for a_, b in want))
    early = rank["phase_rule"]["device_work_before_its_launch"]
    assert early["events"] == 9 and early["max_us"] == pytest.approx(30_000 - 2_000 + 500 + 20, abs=20)
    assert invariant_violations(a, p) == []
