"""The SwiGLU MLP, apart from the model so the dense blocks and the MoE layer (its experts'
shape, its shared expert) both use it without importing each other."""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig

Reduce = Callable[[Tensor], Tensor]


def identity(x: Tensor) -> Tensor:
    """The `reduce` hook on one process (the TP plan points it at an allreduce)."""
    return x


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.intermediate_size, bias=False)  # gate
        self.w3 = nn.Linear(cfg.dim, cfg.intermediate_size, bias=False)  # up
        self.w2 = nn.Linear(cfg.intermediate_size, cfg.dim, bias=False)  # down
        self.reduce: Reduce = identity

    def forward(self, x: Tensor) -> Tensor:
        return self.reduce(self.w2(F.silu(self.w1(x)) * self.w3(x)))
