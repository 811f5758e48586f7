"""Tensor parallelism on real gloo ranks equals the single-process model."""

import pytest
import torch

from commprobe.probe.launch import launch
from commprobe.reference_impl.config import get_preset
from commprobe.reference_impl.model import build_model, greedy_generate
from tests.workers import tp_generate

GQA = get_preset("tiny")  # 8 query heads over 4 KV heads
MHA = GQA.with_(name="tiny-mha", n_heads=4, n_kv_heads=4, dim=64)
STEPS = 8


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_prefill_and_decode_match_single_process(tp):
    prompt = torch.randint(0, GQA.vocab_size, (2, 13), generator=torch.Generator().manual_seed(5))
    per_rank = launch(tp_generate, tp, ([GQA, MHA], prompt, STEPS), backend="gloo", timeout=240)
    for i, cfg in enumerate([GQA, MHA]):
        with torch.inference_mode():
            ref_logits, ref_toks = greedy_generate(build_model(cfg, seed=0), prompt, STEPS)
        for rank, results in enumerate(per_rank):
            logits, toks = results[i]
            diff = (logits - ref_logits).abs().max().item()
            assert diff < 1e-4, f"{cfg.name} TP={tp} rank {rank}: max abs diff {diff}"
            assert torch.equal(toks, ref_toks), f"{cfg.name} TP={tp} rank {rank}: tokens differ"
