"""Context parallelism (ring attention) and expert parallelism (MoE all-to-all) on real gloo
ranks equal the single-process model: prefill logits, greedy decode, warm-cache prefill."""

import pytest
import torch

from commprobe.collectives.mesh import Mesh
from commprobe.probe.launch import launch
from commprobe.reference_impl.config import get_preset
from commprobe.reference_impl.cp import balanced_shards, choose_variant
from commprobe.reference_impl.ep import check_ep
from commprobe.reference_impl.model import build_model, greedy_generate
from tests.workers import mesh_generate

DENSE = get_preset("tiny")  # 8 query heads over 4 KV heads
MOE1 = get_preset("moe-tiny")  # 4 experts, top-1
MOE2 = MOE1.with_(name="moe-tiny-k2", top_k=2)
STEPS = 8
TOL = 1e-4


def _prompt(length: int, batch: int = 2, seed: int = 5) -> torch.Tensor:
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


def _reference(cfg, prompt, steps, turn2=None):
    with torch.inference_mode():
        model = build_model(cfg, seed=0)
        logits, toks = greedy_generate(model, prompt, steps)
        ref = {"logits": logits, "toks": toks}
        if turn2 is not None:
            model.setup_cache(prompt.shape[0], prompt.shape[1] + turn2.shape[1])
            model.prefill(prompt)
            ref["turn2"] = model.prefill(turn2, start=prompt.shape[1])
    return ref


def _check(per_rank, runs, prompt, label):
    for i, run in enumerate(runs):
        ref = _reference(run["cfg"], prompt, STEPS, run.get("turn2"))
        for rank, results in enumerate(per_rank):
            got = results[i]
            what = f"{label} {run['cfg'].name} {run.get('variant', '')} rank {rank}"
            diff = (got["logits"] - ref["logits"]).abs().max().item()
            assert diff < TOL, f"{what}: prefill logits differ by {diff}"
            assert torch.equal(got["toks"], ref["toks"]), f"{what}: decoded tokens differ"
            if "turn2" in ref:
                diff = (got["turn2"] - ref["turn2"]).abs().max().item()
                assert diff < TOL, f"{what}: warm-cache prefill differs by {diff}"


def test_balanced_shards_pair_early_and_late_chunks():
    s = balanced_shards(0, 13, 2)  # 4 chunks of 4,3,3,3: rank 0 gets chunks 0 and 3, rank 1 chunks 1 and 2
    assert s[0].tolist() == [0, 1, 2, 3, 10, 11, 12] and s[1].tolist() == [4, 5, 6, 7, 8, 9]
    s = balanced_shards(100, 16, 2)
    assert s[0].tolist() == [100, 101, 102, 103, 112, 113, 114, 115]
    assert sorted(torch.cat(balanced_shards(7, 29, 3)).tolist()) == list(range(7, 36))


def test_variant_rule():
    # P / (T + P) < 2 Hkv / H picks pass-Q: Llama 3 405B (128 heads, 8 KV): threshold 12.5 %
    assert choose_variant(0, 4096, 128, 8) == "pass-kv"  # cold cache
    assert choose_variant(100_000, 10_000, 128, 8) == "pass-q"  # 9 % new
    assert choose_variant(50_000, 10_000, 128, 8) == "pass-kv"  # 17 % new
    assert choose_variant(8, 13, 8, 4) == "pass-q"  # tiny: threshold 1, any warm cache


@pytest.mark.parametrize("cp", [2, 3])
def test_cp_ring_attention_matches_single_process(cp):
    prompt = _prompt(13)  # not a multiple of 2N for N = 2 or 3
    turn2 = _prompt(5, seed=9)
    runs = [{"cfg": DENSE, "variant": "pass-kv", "turn2": turn2},
            {"cfg": DENSE, "variant": "pass-q", "turn2": turn2},
            {"cfg": DENSE, "variant": "auto", "turn2": turn2}]
    per_rank = launch(mesh_generate, cp, ({"cp": cp}, runs, prompt, STEPS), backend="gloo", timeout=240)
    _check(per_rank, runs, prompt, f"CP={cp}")
    auto = per_rank[0][2]
    assert auto["variant"] == "pass-kv" and auto["turn2_variant"] == "pass-q"


@pytest.mark.parametrize("ep", [2, 4])
def test_ep_moe_matches_single_process(ep):
    prompt = _prompt(13)
    runs = [{"cfg": MOE1}, {"cfg": MOE2}]
    per_rank = launch(mesh_generate, ep, ({"ep": ep}, runs, prompt, STEPS), backend="gloo", timeout=240)
    _check(per_rank, runs, prompt, f"EP={ep}")


def test_moe_routing_is_uneven_and_leaves_an_expert_idle():
    """The EP tests above exercise uneven splits: the prompt's tokens spread unevenly, and a
    decode step (2 tokens, top-1, 4 experts) always leaves at least two experts with none."""
    model = build_model(MOE1, seed=0)
    with torch.inference_mode():
        x = model.tok_embeddings(_prompt(13)).reshape(-1, MOE1.dim)
        idx, _ = model.layers[0].feed_forward.route(model.layers[0].ffn_norm(x))
    counts = torch.bincount(idx.reshape(-1), minlength=4).tolist()
    assert len(set(counts)) > 1, counts


@pytest.mark.parametrize("layout", [{"tp": 2, "cp": 2}, {"tp": 2, "ep": 2}])
def test_tp_combined_with_cp_or_ep(layout):
    prompt = _prompt(13)
    turn2 = _prompt(5, seed=9)
    runs = ([{"cfg": DENSE, "variant": "pass-kv"}, {"cfg": DENSE, "variant": "pass-q", "turn2": turn2}]
            if "cp" in layout else [{"cfg": MOE1}, {"cfg": MOE2}])
    per_rank = launch(mesh_generate, 4, (layout, runs, prompt, STEPS), backend="gloo", timeout=240)
    _check(per_rank, runs, prompt, str(layout))


def test_cp_and_ep_over_dda_match_single_process():
    """The same plans over commprobe's DDA (shared-memory ring send/recv, all-to-all, all-gather)."""
    prompt = _prompt(13)
    turn2 = _prompt(5, seed=9)
    runs = [{"cfg": DENSE, "variant": "pass-kv", "turn2": turn2}, {"cfg": DENSE, "variant": "pass-q"}]
    per_rank = launch(mesh_generate, 2, ({"cp": 2}, runs, prompt, STEPS, "dda"), backend="gloo", timeout=240)
    _check(per_rank, runs, prompt, "CP=2 dda")
    runs = [{"cfg": MOE2}]
    one = _prompt(13, batch=1)  # decode with one token: one EP rank dispatches no rows at all
    per_rank = launch(mesh_generate, 2, ({"ep": 2}, runs, one, STEPS, "dda"), backend="gloo", timeout=240)
    _check(per_rank, runs, one, "EP=2 dda")


def test_mesh_layout_is_explicit():
    m = Mesh(tp=2, cp=2)
    assert m.all_groups("tp") == [[0, 1], [2, 3]] and m.all_groups("cp") == [[0, 2], [1, 3]]
    assert m.coords(3) == {"tp": 1, "cp": 1, "ep": 0}
    assert "rank 2: tp 0 cp 1 ep 0 (tp group [2, 3], cp group [0, 2])" in m.describe()
    m = Mesh(tp=2, ep=2)
    assert m.all_groups("ep") == [[0, 2], [1, 3]]


def test_ep_rejects_dense_and_non_divisors():
    with pytest.raises(ValueError, match="needs a mixture-of-experts preset"):
        check_ep(DENSE, 2)
    with pytest.raises(ValueError, match="does not divide the 4 experts"):
        check_ep(MOE1, 3)
