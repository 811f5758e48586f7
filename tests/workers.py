"""Rank bodies for tests. Spawned ranks import functions by module path, so they live here."""

from __future__ import annotations

import torch

from collectives.comm import TorchComm
from reference_impl.config import ModelConfig
from reference_impl.model import build_model, greedy_generate
from reference_impl.tp import apply_tp


def tp_generate(cfgs: list[ModelConfig], prompt: torch.Tensor, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each config: build the seeded model, shard it over the world, prefill + greedy decode."""
    comm = TorchComm("tp")
    out = []
    with torch.inference_mode():
        for cfg in cfgs:
            model = apply_tp(build_model(cfg, seed=0), comm)
            logits, toks = greedy_generate(model, prompt, steps)
            out.append((logits.clone(), toks.clone()))
    return out
