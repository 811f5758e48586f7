"""A real SGLang 0.5.23 server's own profiler files (CPU, TP=2 on gloo; tests/data/traces/sglang-cpu-tp2,
its README says what a careful reading gives) read as SGLang writes them (issue 57): each
collective once, the logits all-gather TP, blocked time from the call that blocks, per-stage files
joined, the merged file set aside. Every truth is counted here from the raw events."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from commprobe.analyzers.analysis import analyze
from tests.conftest import invariant_violations
from tests.test_first_contact_3 import _union

SETS = ("manual", "by_stage", "merged")
_API = re.compile(r"torch/distributed/distributed_c10d\.py\(\d+\): \w+$")
_STEP = re.compile(r"^step\[(EXTEND|DECODE)")


def _raw(path: Path) -> dict:
    """Per file: its rank, per stage (windows, µs in windows, µs blocked in communication: the
    union of the c10d ops, their Work.wait() and torch.distributed's API frames holding them on the
    scheduler's thread), and its c10d calls by name."""
    doc = json.load(gzip.open(path))
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in xs if _STEP.match(e["name"])]
    main = steps[0]["tid"]
    ops = [e for e in xs if e["tid"] == main and e["name"].startswith("c10d::")]
    api = [f for f in xs if f["tid"] == main and _API.search(f["name"])
           and any(f["ts"] <= o["ts"] and o["ts"] + o["dur"] <= f["ts"] + f["dur"] for o in ops)]
    waits = [e for e in xs if e["tid"] == main and e["name"].startswith("<built-in method wait of")]
    blocked = _union([(e["ts"], e["ts"] + e["dur"]) for e in ops + api + waits])
    out = {"rank": doc["distributedInfo"]["rank"], "calls": {}}
    for o in ops:
        out["calls"][o["name"]] = out["calls"].get(o["name"], 0) + 1
    for stage, phase in (("EXTEND", "prefill"), ("DECODE", "decode")):
        ws = [(e["ts"], e["ts"] + e["dur"]) for e in steps if e["name"].startswith(f"step[{stage}")]
        inside = sum(max(0.0, min(b, hi) - max(a, lo)) for lo, hi in ws for a, b in blocked)
        out[phase] = (len(ws), sum(b - a for a, b in ws), inside)
    return out


def _truth(d: Path) -> dict[int, dict]:
    """Per rank, summed over its files (a per-stage set has two per rank; a merge is left out)."""
    per: dict[int, dict] = {}
    for f in sorted(d.glob("*.trace.json.gz")):
        if f.name.startswith("merged-"):
            continue
        r = _raw(f)
        t = per.setdefault(r["rank"], {"calls": {}, "prefill": [0, 0.0, 0.0], "decode": [0, 0.0, 0.0]})
        for k, v in r["calls"].items():
            t["calls"][k] = t["calls"].get(k, 0) + v
        for ph in ("prefill", "decode"):
            t[ph] = [a + b for a, b in zip(t[ph], r[ph])]
    return per


@pytest.fixture(scope="module")
def sets(real_traces) -> dict[str, tuple[dict, dict]]:
    return {s: (_truth(real_traces / "sglang-cpu-tp2" / s), analyze(real_traces / "sglang-cpu-tp2" / s)) for s in SETS}


@pytest.mark.parametrize("name", SETS)
def test_each_set_reads_as_the_raw_events_do(sets, real_traces, name):
    truth, a = sets[name]
    assert sorted(r["rank"] for r in a["ranks"]) == sorted(truth) == [0, 1]  # no refusal, two ranks
    calls = {r: sum(t["calls"].values()) for r, t in truth.items()}
    assert a["collectives"]["matched_calls"] == calls[0] == calls[1]  # each collective once
    gathers = sum(t["calls"].get("c10d::_allgather_base_", 0) for t in truth.values())
    assert a["axes_by_category"]["other_comm"]["tp"] == gathers  # the logits all-gather is TP
    assert a["axes_by_category"]["tp_allreduce"] == {"tp": sum(t["calls"]["c10d::allreduce_"] for t in truth.values())}
    for r in a["ranks"]:
        t = truth[r["rank"]]
        for ph, p in r["phases"].items():
            n, us, blocked = t[ph]
            assert p["windows"] == n
            assert p["e2e_us"] == pytest.approx(us, rel=1e-6)
            comm = sum(c["exposed_us"] for k, c in p["categories"].items()
                       if k in ("tp_allreduce", "cp_ring", "ep_all_to_all", "other_comm"))
            assert 100 * comm / p["e2e_us"] == pytest.approx(100 * blocked / us, abs=2.0), (r["rank"], ph)
            assert p["idle_us"] <= 0.01 * p["e2e_us"]  # Python runs through every step: no false idle
    assert invariant_violations(a, real_traces / "sglang-cpu-tp2" / name) == []


def test_the_per_stage_files_are_joined_and_the_merge_set_aside(sets):
    _, by_stage = sets["by_stage"]
    assert sum("per-stage files read as one rank" in n for n in by_stage["source"]["reader_notes"]) == 2
    _, merged = sets["merged"]
    assert [Path(s["file"]).name for s in merged["source"]["skipped"]] == ["merged-1796569447.755208.trace.json.gz"]


def test_the_advice_is_the_engines_own(sets):
    """An SGLang operator is told SGLang's remedies (on CPU: its shared-memory allreduce, core
    binding), not commprobe's --backend dda."""
    _, a = sets["manual"]
    recs = [x for p in a["phases"].values() for x in p["recommendations"]]
    assert recs and any("SGLang's CPU shared-memory allreduce" in x and "SGLANG_CPU_OMP_THREADS_BIND" in x for x in recs)
    assert not any("commprobe --backend dda" in x for x in recs)
