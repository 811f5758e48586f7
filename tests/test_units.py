"""Direct tests of the per-rank pipeline's pieces against brute-force versions: interval
arithmetic, the linker's enclosing-op search, the engines' phase rules, and the verdict."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from commprobe.analyzers.cross_rank.verdict import phase_summary
from commprobe.analyzers.per_rank import intervals as iv
from commprobe.analyzers.per_rank.intervals import enclosing
from commprobe.analyzers.per_rank.phases import RULES
from commprobe.common.vocab import WORK_CATEGORIES, Verdict

GRID = 64  # integer times: brute force on a grid of unit cells is exact


def _cells(pairs) -> set[int]:
    return {c for s, e in pairs for c in range(s, e)}


def _as_iv(pairs) -> iv.Intervals:
    s = np.array([p[0] for p in pairs], float)
    e = np.array([p[1] for p in pairs], float)
    return iv.union(s, e)


def _iv_cells(x: iv.Intervals) -> set[int]:
    return _cells(zip(x[0].astype(int).tolist(), x[1].astype(int).tolist()))


spans = st.lists(st.tuples(st.integers(0, GRID - 1), st.integers(1, 16)).map(lambda p: (p[0], min(GRID, p[0] + p[1]))),
                 max_size=12)


@settings(max_examples=300, deadline=None)
@given(spans, spans, st.integers(0, GRID), st.integers(0, GRID))
def test_interval_arithmetic_equals_brute_force(a, b, lo, hi):
    ua, ub = _as_iv(a), _as_iv(b)
    assert _iv_cells(ua) == _cells(a) and iv.length(ua) == len(_cells(a))
    assert np.all(ua[0][1:] > ua[1][:-1])  # disjoint, sorted, touching blocks merged
    assert _iv_cells(iv.intersect(ua, ub)) == _cells(a) & _cells(b)
    assert _iv_cells(iv.subtract(ua, ub)) == _cells(a) - _cells(b)
    lo, hi = min(lo, hi), max(lo, hi)
    assert _iv_cells(iv.clip(ua, lo, hi)) == _cells(a) & set(range(lo, hi))
    got = iv.covered(ua, np.array([lo], float), np.array([hi], float))
    assert got[0] == len(_cells(a) & set(range(lo, hi)))


ops = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(0, 20)), max_size=10)


@settings(max_examples=300, deadline=None)
@given(ops, st.lists(st.tuples(st.integers(0, 2), st.integers(0, 60)), min_size=1, max_size=10))
def test_enclosing_op_is_the_innermost_holding_interval(host, queries):
    """For each (thread, time): the innermost interval on that thread holding the time. Nested
    intervals (a host op inside another) prefer the inner one; overlapping siblings any that holds."""
    tid = np.array([h[0] for h in host], float)
    start = np.array([h[1] for h in host], float)
    end = start + np.array([h[2] for h in host], float)
    q_tid = np.array([q[0] for q in queries], float)
    q_t = np.array([q[1] for q in queries], float)
    got = enclosing(tid, start, end, q_tid, q_t)
    for k, (qt, t) in enumerate(queries):
        holders = [i for i in range(len(host)) if tid[i] == qt and start[i] <= t <= end[i]]
        if not holders:
            assert got[k] == -1
            continue
        assert got[k] in holders
        # the latest-starting interval at or before t (the innermost of nested ones) wins when it holds t
        started = [i for i in range(len(host)) if tid[i] == qt and start[i] <= t]
        latest = max(started, key=lambda i: (start[i], i))
        if end[latest] >= t:
            assert got[k] == latest


def _phase(name: str) -> tuple[str, str, dict] | None:
    for r in RULES:
        if r.claims(name):
            m = r.pattern.match(name)
            return (r.name, r.phase_of(m), r.counts(m)) if m else (r.name, "malformed", {})
    return None


def test_phase_rules_name_each_engines_steps():
    assert _phase("execute_context_2(40)_generation_0(0)") == (
        "vllm-v1", "prefill", {"context_requests": 2, "context_tokens": 40, "generation_requests": 0,
                               "generation_tokens": 0})
    assert _phase("execute_context_1(3)_generation_5(5)")[1] == "mixed"
    assert _phase("execute_context_0(0)_generation_5(5)")[1] == "decode"
    assert _phase("execute_new_0_cached_4")[1] == "cached"
    assert _phase("step[decode bs=8 dec=8]") == ("sglang", "decode", {"requests": 8, "decode_tokens": 8})
    assert _phase("[Executor] _forward_step 3: 0 ctx reqs, 4 gen reqs")[:2] == ("trtllm", "decode")
    assert _phase("ProfilerStep#12")[:2] == ("profiler-step", "step")
    assert _phase("commprobe/decode")[:2] == ("commprobe", "decode")
    assert _phase("gemm") is None


def test_phase_rules_read_the_engines_annotations_as_written_today():
    """vLLM's token field with two numbers (a real B200 trace), its detailed_trace_annotation form,
    SGLang's EXTEND (prefill over a cached prefix); a step-looking name that does not parse is
    malformed, not another rule's or nothing."""
    assert _phase("execute_context_1(888_788544)_generation_0(0)") == (
        "vllm-v1", "prefill", {"context_requests": 1, "context_tokens": 888, "generation_requests": 0,
                               "generation_tokens": 0})
    assert _phase("execute_64_context_2(sq60sk84sqsq2522sqsk2786)_generation_4(sq4sk300)")[:2] == ("vllm-v1", "mixed")
    assert _phase("step[EXTEND bs=2 toks=40]") == ("sglang", "prefill", {"requests": 2, "prefill_tokens": 40})
    assert _phase("execute_context_1(?)_generation_0(0)") == ("vllm-v1", "malformed", {})
    assert _phase("execute_new_1_cached_0")[:2] == ("vllm-v1-new-cached", "prefill")


def test_a_malformed_engine_step_is_counted_with_its_text_not_silently_whole_trace(tmp_path):
    from commprobe.analyzers.analysis import analyze
    from tests.kineto_events import HOST, ev, kernel, write

    bad = "execute_context_1(?)_generation_0(0)"
    r = analyze(write(tmp_path / "rank0.json.gz", [ev(bad, 0, 500, HOST, "user_annotation"), kernel("gemm", 10, 400)]))
    rule = r["ranks"][0]["phase_rule"]
    assert (rule["rule"], rule["malformed"], rule["malformed_names"]) == ("whole-trace", 1, [bad])


def _rank(phase: str, e2e: float, exposed: dict[str, float], idle: float = 0.0, timeline: str = "device") -> dict:
    cats = {c: {"exposed_us": exposed.get(c, 0.0), "total_us": exposed.get(c, 0.0)} for c in WORK_CATEGORIES}
    return {"rank": 0, "timeline": timeline,
            "phases": {phase: {"e2e_us": e2e, "idle_us": idle, "windows": 1, "categories": cats}}}


def test_verdict_follows_the_threshold_and_idle_rule():
    v = lambda r: phase_summary([r], 0.2, {}, [])["decode"]  # noqa: E731
    comm = v(_rank("decode", 100, {"tp_allreduce": 30, "compute": 70}))
    assert comm["verdict"] == Verdict.COMMUNICATION and comm["dominant"] == "tp_allreduce" and comm["axis"] == "tp"
    assert v(_rank("decode", 100, {"tp_allreduce": 19, "compute": 81}))["verdict"] == Verdict.COMPUTE
    assert v(_rank("decode", 100, {"compute": 40}, idle=60))["verdict"] == Verdict.HOST
    # a mostly idle host window is not compute-bound: nothing on the host timeline says what the rest was
    host_idle = v(_rank("decode", 100, {"compute": 40}, idle=60, timeline="host"))
    assert host_idle["verdict"] == Verdict.UNKNOWN and host_idle["verdict_rule"]["name"] == "host idle"
    assert "host timeline only" in host_idle["summary"] and not host_idle["recommendations"]
    busy_host = v(_rank("decode", 100, {"compute": 70}, idle=30, timeline="host"))
    assert busy_host["verdict"] == Verdict.COMPUTE and "host timeline only" in busy_host["summary"]
    assert busy_host["notes"][0].startswith("host timeline only")
    # windows holding almost nothing: no verdict, the work per window said
    empty = v(_rank("decode", 1000, {"compute": 5}, idle=995))
    assert empty["verdict"] == Verdict.UNKNOWN and "hold 5 µs of recorded device work each" in empty["summary"]


def test_windows_of_no_length_give_no_verdict(tmp_path):
    """Step markers of zero duration at one instant bound nothing: the windows hold no work, so there
    is no verdict (before: 'compute-bound, compute 0 %'). One such marker is a step's start
    (torch.profiler's convention): its step runs to the end of the work on its thread."""
    from commprobe.analyzers.analysis import analyze
    from tests.kineto_events import HOST, ev, write

    one = analyze(write(tmp_path / "one.json.gz", [ev("ProfilerStep#0", 100, 0, HOST, "user_annotation"),
                                                    ev("aten::mm", 200, 500, HOST)]))
    assert one["ranks"][0]["windows"]["step"] == [[100.0, 700.0]]
    assert one["ranks"][0]["phase_rule"]["markers_as_boundaries"]["evidence"] == "hold no work"
    for marks in ([100, 100],):
        events = [ev(f"ProfilerStep#{k}", t, 0, HOST, "user_annotation") for k, t in enumerate(marks)]
        p = analyze(write(tmp_path / f"t{len(marks)}.json.gz", [*events, ev("aten::mm", 200, 500, HOST)]))["phases"]["step"]
        assert p["verdict"] == Verdict.UNKNOWN and p["verdict_rule"]["name"] == "no work in the windows", p
        assert p["largest"] == "idle" and "hold 0 µs of recorded host work" in p["summary"]


def test_every_verdict_agrees_with_its_shares():
    """Over a grid of shares: 'largest' is the largest share (idle included); compute-bound only where
    computation is the largest work and the timeline busy at least half; communication-bound only
    above the threshold; host/launch-bound only on a device idle over half; the rule named gives
    the verdict given."""
    import itertools

    from commprobe.analyzers.cross_rank.verdict import RULES

    v = lambda r: phase_summary([r], 0.2, {}, [])["decode"]  # noqa: E731
    for tl, comm, comp, copy, idle in itertools.product(("device", "host"), (0, 10, 30), (0, 20, 60), (0, 25, 50),
                                                        (0, 40, 70)):
        other = max(0, 100 - comm - comp - copy - idle)
        p = v(_rank("decode", 100, {"tp_allreduce": comm, "compute": comp, "memcpy": copy, "other": other}, idle, tl))
        cands = {**p["exposed_share"], "idle": p["idle_share"]}
        assert cands[p["largest"]] == max(cands.values())
        if p["verdict"] == Verdict.COMPUTE:
            work = {c: x for c, x in p["exposed_share"].items()}
            assert max(work, key=work.get) in ("compute", "other") and p["idle_share"] <= 0.5
        if p["verdict"] == Verdict.COMMUNICATION:
            assert p["exposed_comm_share"] > 0.2
        if p["verdict"] == Verdict.HOST:
            assert tl == "device" and p["idle_share"] > 0.5
        if p["verdict"] == Verdict.DATA_MOVEMENT:
            assert p["exposed_share"]["memcpy"] > max(p["exposed_share"]["compute"], p["exposed_share"]["other"])
        rule = next(r for r in RULES if r.name == p["verdict_rule"]["name"])
        assert rule.verdict == p["verdict"]


def test_copies_dominating_are_data_movement_bound_naming_the_direction(tmp_path):
    """A window that is mostly copies is not compute-bound (a real 2xH100 export read 97 % memcpy
    as compute-bound): its own verdict, naming the direction from the copies' names."""
    from commprobe.analyzers.analysis import analyze
    from tests.kineto_events import HOST, ev, kernel, write

    events = [ev("ProfilerStep#1", 0, 1000, HOST, "user_annotation"), kernel("gemm", 0, 30),
              ev("Memcpy HtoD (Pageable -> Device)", 40, 800, 7, "gpu_memcpy"),
              ev("Memcpy DtoH (Device -> Pageable)", 850, 100, 7, "gpu_memcpy")]
    r = analyze(write(tmp_path / "rank0.json.gz", events))
    step = r["phases"]["step"]
    assert step["verdict"] == "data-movement-bound" and step["dominant"] == "memcpy"
    assert "mostly host to device (H2D), 89% of copy time" in step["summary"]
    assert any(rec.startswith("copies take 90% of step, mostly host to device") for rec in step["recommendations"])
    assert r["ranks"][0]["device_work"]["copy_us_by_direction"] == {"D2H": 100.0, "H2D": 800.0}
