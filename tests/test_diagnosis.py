"""Diagnosis of known causes (issue: diagnosis accuracy, measured): performance faults of known size
injected into the reference workload (probe/faults.py), the analysis' split of communication
into transfer and waiting for a late rank (analyzers/cross_rank/cause.py), and the verdict that
follows from it. The truth is what was injected, and the time found is checked against its size."""

from __future__ import annotations

import pytest

from commprobe.analyzers.cross_rank.verdict import phase_summary
from commprobe.probe.faults import perf_fault
from tests.conftest import invariant_violations, run_cli


@pytest.mark.parametrize("spec,want", [
    ("slow-rank:1@50", ("slow-rank", "1", 50.0, 1)),
    ("slow-link:tp@300", ("slow-link", "tp", 300.0, None)),
    ("jitter@4000", ("jitter", None, 4000.0, None)),
    ("jitter:0@10", ("jitter", "0", 10.0, 0)),
    ("host-stall:1@600", ("host-stall", "1", 600.0, 1)),
    ("hot-expert:3@95", ("hot-expert", "3", 95.0, None)),
])
def test_fault_specs_parse(spec, want):
    f = perf_fault(spec)
    assert (f.kind, f.target, f.dose, f.rank) == want


@pytest.mark.parametrize("spec", ["slow-rank:1", "slow-link:xx@5", "slow-rank:a@5", "jitter:x@5", "host-stall:1@-1",
                                  "hot-expert:3@nan", "slow-rank:1@1e5"])
def test_bad_fault_specs_are_one_line(spec):
    with pytest.raises(ValueError) as e:
        perf_fault(spec)
    assert "\n" not in str(e.value) and spec in str(e.value)


def test_a_bad_fault_is_refused_before_any_rank_starts(tmp_path):
    r = run_cli("profile", "--preset", "tiny", "--steps", "2", "--repeats", "1", "--prompt-len", "8",
                "--out", str(tmp_path / "b"), env={"COMMPROBE_FAULT": "slow-link:zz@5"})
    assert r.returncode != 0 and "slow-link needs an axis" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def _rank(rank: int, compute: float, comm: float, wait: float, idle: float = 0.0, caused: dict | None = None,
          matched: int = 10, calls: int = 10) -> dict:
    """A rank's one-window decode phase: numbers in µs."""
    cats = {c: {"total_us": 0.0, "exposed_us": 0.0, "exposed_wait_us": 0.0}
            for c in ("compute", "tp_allreduce", "cp_ring", "ep_all_to_all", "other_comm", "memcpy", "other")}
    cats["compute"]["exposed_us"] = cats["compute"]["total_us"] = compute
    cats["tp_allreduce"].update(total_us=comm, exposed_us=comm, exposed_wait_us=wait)
    e2e = compute + comm + idle
    acc = {"calls": calls, "matched": matched, "baseline_calls": 0, "log_ratio_sum": 0.0,
           "wait_by_last": {str(k): v for k, v in (caused or {}).items()}}
    return {"rank": rank, "timeline": "host", "phase_rule": {}, "phases": {"decode": {
        "e2e_us": e2e, "idle_us": idle, "windows": 1, "categories": cats, "comm_calls": {"tp_allreduce": acc}}}}


def test_waiting_for_a_late_rank_is_imbalance_not_communication():
    """Rank 0 waits 550 µs of its 600 µs allreduce for rank 1, whose compute is 550 µs longer: the
    communication share passes the threshold, but its fix is rank 1, so the verdict says so."""
    rows = [_rank(0, 300, 600, 550, caused={1: 550}), _rank(1, 850, 50, 0)]
    p = phase_summary(rows, 0.2, {}, [])["decode"]
    c = p["communication_cause"]
    assert c["class"] == "skew-dominated" and c["culprit"] == 1 and c["cause"] == "skew"
    assert p["verdict"] == "imbalance-bound" and p["verdict_rule"]["name"] == "waiting for a late rank"
    assert "rank 1" in p["summary"] and "550 µs more compute" in p["summary"]
    assert not any("DDA" in r for r in p["recommendations"])  # no advice on the collective for waiting time


def test_transfer_is_communication_and_one_rank_cannot_tell():
    both = [_rank(0, 500, 500, 10, caused={1: 10}), _rank(1, 500, 500, 0)]
    p = phase_summary(both, 0.2, {}, [])["decode"]
    assert p["verdict"] == "communication-bound" and p["communication_cause"]["class"] == "transfer-dominated"
    one = [_rank(0, 500, 500, 0, matched=0)]  # one rank's trace: no call can be matched
    p = phase_summary(one, 0.2, {}, [])["decode"]
    assert p["communication_cause"]["class"] == "inconclusive" and p["verdict"] == "communication-bound"
    assert "cannot be told" in p["summary"]


def test_mixed_names_both_parts():
    rows = [_rank(0, 200, 800, 500, caused={1: 500}), _rank(1, 700, 300, 0)]
    p = phase_summary(rows, 0.2, {}, [])["decode"]
    assert p["verdict"] == "communication/imbalance-bound"
    assert "transfer" in p["summary"] and "waiting" in p["summary"]


def test_spread_waiting_has_no_culprit():
    rows = [_rank(0, 300, 300, 280, idle=400, caused={1: 280}), _rank(1, 300, 300, 280, idle=400, caused={0: 280})]
    c = phase_summary(rows, 0.2, {}, [])["decode"]["communication_cause"]
    assert c["culprit"] is None and c["class"] == "skew-dominated"
    assert c["causes"] and c["causes"][0]["cause"] == "skew" and c["causes"][0]["rank"] is None


def _calls(spans: list[tuple[float, float]]):
    import numpy as np

    from commprobe.analyzers.per_rank.calls import Calls

    n = len(spans)
    return Calls([("tp", "allreduce")], np.zeros(n, np.int64), np.arange(n, dtype=np.int64),
                 np.array([a for a, _ in spans], float), np.array([b for _, b in spans], float), np.full(n, 256.0),
                 [("allreduce", "tp", "tp_allreduce", "declared")], np.zeros(n, np.int64), np.full(n, 2, np.int64))


def test_a_stop_inside_a_call_is_the_stopped_ranks_own_delay():
    """Arrival alone blames the last arriver for all of a rank's extra time in a call. Call 0: rank 1
    arrives first (t=0), rank 0 at 100 and leaves at 110; rank 1, stopped after arriving, leaves at
    6,110, 6,000 µs after rank 0 left. Up to the 100 µs it had waited, a stay after the last arriver
    left is counted as the waiter's wake-up lag (rank 0's); the 5,900 beyond, its own delay. Call 1: rank 0 waits 5,000 µs for a
    late rank 1 and wakes 1,500 µs after it left: a wake-up lag shorter than the wait, rank 1's."""
    import numpy as np

    from commprobe.analyzers.cross_rank.matching import match

    out = match({0: _calls([(100, 110), (10_000, 16_510)]), 1: _calls([(0, 6_110), (15_000, 15_010)])})
    rows = {x["rank"]: x for x in out["ranks"]}
    assert rows[1]["wait_us"] == pytest.approx(6_100) and rows[1]["held_us"] == pytest.approx(5_900)
    assert rows[0]["wait_us"] == pytest.approx(6_500) and rows[0]["held_us"] == 0
    # rank 1 caused 5,900 (its stop) + 6,500 (rank 0's wait and wake-up); rank 0 caused 200
    assert rows[1]["caused_wait_us"] == pytest.approx(12_400) and rows[0]["caused_wait_us"] == pytest.approx(200)
    # rank 1 caused the most, but two calls cannot tell a lead from the noise (straggler.py)
    assert out["straggler_rule"]["most_waiting_caused_by"] == 1 and out["straggler_rule"]["z"] < 2
    assert out["straggler"] is None
    wait, transfer, last, held = out["_waits"][1][:4]
    assert last.tolist() == [0, 1] and np.allclose(held, [5_900, 0]) and np.allclose(transfer, [10, 10])


def test_calibration_file_errors_are_one_line(tmp_path):
    bad = tmp_path / "cal.json"
    bad.write_text("[1, 2]")
    from commprobe.analyzers import calibration

    with pytest.raises(calibration.CalibrationError) as e:
        calibration.read_sweep(bad)
    assert "\n" not in str(e.value)
    rows = calibration.read_sweep(_sweep(tmp_path))
    assert rows[0]["p10_us"] == 9.0 <= rows[0]["time_us"]


def _sweep(tmp_path):
    import json

    f = tmp_path / "sweep.json"
    f.write_text(json.dumps([{"backend": "dda", "op": "allreduce", "bytes": 256, "world": 2, "time_us": 10.0,
                              "batches_us": [9.0, 10.0, 12.0]}]))
    return f


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """A small real suite on TP=2 DDA: healthy, a slow rank, a slower link, a host stall."""
    from commprobe.probe.bench.diagnosis import LAYOUTS, Case, run_suite

    cat = LAYOUTS["tp2"][2]
    todo = [Case("tp2", "dda", None, "none", None, "none", None, cat),
            Case("tp2", "dda", "slow-rank", "high", "slow-rank:1@500", "skew", 1, cat),
            Case("tp2", "dda", "slow-link", "high", "slow-link:tp@300", "slow-transfer", None, cat),
            Case("tp2", "dda", "host-stall", "high", "host-stall:1@2000", "skew", 1, cat)]
    return run_suite(todo, tmp_path_factory.mktemp("diag"))


def test_known_causes_are_named_with_their_culprit_and_size(suite):
    by = {c["cause"]: c for c in suite["cases"]}
    assert all(c["right"] for c in suite["cases"]), [(c["spec"], c["given"], c["given_culprit"]) for c in suite["cases"]]
    assert by[None]["given"] == "none" and suite["healthy_flagged"] == 0
    assert by["slow-rank"]["verdict"] in ("imbalance-bound", "communication/imbalance-bound")
    assert by["slow-link"]["verdict"] == "communication-bound"
    # the size: 300 µs inside each of 4 allreduces a decode step, found as transfer over the healthy run
    # (within 15 %: measured +0.6 to +3.4 % in 4 runs, +14 % once in 8 under this machine's bursts: two
    # runs' transfer noise, the healthy one's included); 2000 µs of stall before each of 2 layers, found as
    # rank 0's waiting for rank 1: a stall is a sleep, which only overshoots (timer slack, the wake-up on
    # two busy cores), so the others wait longer than the stall, not shorter: -15 % to +35 % (measured -4
    # to +15 % in most runs, +27 % once in a quiet fresh-clone CI, +56 % once with other work beside it)
    for t in suite["time_found"]:
        if t["spec"].startswith("slow-link"):
            assert t["found_us"] == pytest.approx(t["injected_us"], rel=0.15), t
        else:
            assert 0.85 * t["injected_us"] <= t["found_us"] <= 1.35 * t["injected_us"], t


def test_the_fault_travels_with_the_bundle_and_the_invariants_hold(suite):
    import json
    from pathlib import Path

    from commprobe.analyzers.analysis import analyze

    root = Path(suite["workdir"])
    d = next(root.glob("case*-host-stall-*"))
    m = json.loads((d / "manifest.json").read_text())
    assert m["fault"] == {"kind": "host-stall", "target": "1", "dose": 2000.0, "unit": "µs", "rank": 1}
    res = analyze(d, calibration=root / "ref-tp2-dda")
    assert invariant_violations(res, source=d) == []
    assert res["phases"]["decode"]["communication_cause"]["baseline"]["source"] == "sweep"


def test_the_suite_builds_every_case_with_its_truth():
    """The cases `bench diagnosis` runs (built, not run): 66 in the full suite, 9 quick, each expecting
    the cause and culprit its fault injects (rank 1 for a slow rank, a stall and expert 3's rank)."""
    from commprobe.probe.bench.diagnosis import cases

    full, quick = cases(), cases(quick=True)
    assert len(full) == 66 and len(quick) == 9
    for c in full + quick:
        if c.cause is None or c.dose_name == "below":
            assert (c.expect, c.culprit) == ("none", None), c
        else:
            want = ("slow-transfer", None) if c.cause == "slow-link" else ("skew", None if c.cause == "jitter" else 1)
            assert (c.expect, c.culprit) == want, c


def test_a_straggler_is_named_only_with_a_lead_beyond_the_noise():
    """The straggler rule's two tests (cross_rank/straggler.py) on per-call waits of known spread:
    a starved rank that caused 70 % of the waiting over 200 calls (the real CI capture: 68-71 %) is
    named; ranks taking turns (216 calls last each, 50.5 % against 49.5 %) are not; the same 70 %
    lead from three long waits is not beyond the noise."""
    import numpy as np

    from commprobe.analyzers.cross_rank.straggler import stands_out

    def standing(per_call: dict):
        return stands_out({r: float(np.sum(x)) for r, x in per_call.items()},
                          {r: float(np.sum(np.square(x))) for r, x in per_call.items()},
                          max(len(x) for x in per_call.values()))

    rng = np.random.default_rng(0)
    late = rng.random(200) < 0.7  # who arrived last in each call, the starved rank 70 % of the time
    waits = rng.exponential(100.0, 200)
    s = standing({1: np.where(late, waits, 0.0), 0: np.where(late, 0.0, waits)})
    assert s.name == 1 and s.z > 2 and s.lead > 1.5
    turns = np.arange(432) % 2 == 0
    w = np.full(432, 100.0)
    w[0] += 0.02 * 216 * 100  # 50.5 % against 49.5 %
    s = standing({0: np.where(turns, w, 0.0), 1: np.where(turns, 0.0, w)})
    assert s.top == 0 and s.name is None and s.lead < 1.5
    s = standing({1: np.array([7000.0, 0, 0, 0, 0, 0]), 0: np.array([0, 3000.0, 0, 0, 0, 0])})
    assert s.top == 1 and s.lead > 1.5 and s.name is None and s.z < 2


def test_matching_says_when_calls_record_no_group_size_among_three_ranks_or_more():
    """Two ranks: any call both hold is the pair's. Three or more with no group size recorded: each
    key was taken as one collective of every rank holding it, which two groups of one name would
    share; the result says so (`group_rule`), and says nothing where the sizes are recorded."""
    import numpy as np

    from commprobe.analyzers.cross_rank.matching import match

    spans = [(0, 10), (100, 110)]
    assert "group_rule" not in match({0: _calls(spans), 1: _calls(spans)})
    unsized = {r: _calls(spans) for r in range(4)}
    for c in unsized.values():
        c.group_size = np.zeros(2, np.int64)
    out = match(unsized)
    assert out["matched_calls"] == 2 and out["group_rule"].startswith("2 of 2 matched call(s) record no group size")
    sized = {r: _calls(spans) for r in range(4)}  # a recorded size of 2 among 4 ranks: no call is whole, no rule
    assert "group_rule" not in match(sized) and match(sized)["matched_calls"] == 0
