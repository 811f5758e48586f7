"""A Llama-4-style mixture-of-experts MLP: router, top-k routed experts, one shared expert.

The router scores every expert, keeps the top k, and scales each chosen expert's output by
the sigmoid of its score (Llama 4's gating; softmax over the k scores would make k=1 gating
a constant 1). Every token also goes through the shared expert. Experts are SwiGLU MLPs
stored stacked ([experts, out, in]) so a parallel plan can keep a contiguous slice of them.

Expert parallelism does not live here: `dispatch` is a hook that, on one process, runs the
experts this process holds; `reference_impl.ep` swaps in all-to-all dispatch and combine.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .mlp import FeedForward, Reduce, identity


def local_dispatch(moe: MoE, t: Tensor) -> Tensor:
    """All experts on this process: route, run, weight, add the shared expert, reduce (TP)."""
    idx, w = moe.choose(t)
    k = idx.shape[1]
    token = torch.arange(t.shape[0], device=t.device).repeat_interleave(k)
    return moe.combine(t, token, moe.expert_ffn(t[token], idx.reshape(-1) - moe.first_expert), w)


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        e, i, d = cfg.n_experts, cfg.moe_intermediate_size, cfg.dim
        self.n_experts, self.top_k = e, cfg.top_k
        self.router = nn.Linear(d, e, bias=False)
        self.w1 = nn.Parameter(torch.empty(e, i, d))  # gate, per expert [out, in] like nn.Linear
        self.w3 = nn.Parameter(torch.empty(e, i, d))  # up
        self.w2 = nn.Parameter(torch.empty(e, d, i))  # down
        self.shared = FeedForward(cfg.with_(intermediate_size=i))
        self.first_expert = 0  # this process holds experts first_expert .. first_expert + w1.shape[0] - 1
        self.reduce: Reduce = identity
        self.dispatch: Callable[[MoE, Tensor], Tensor] = local_dispatch
        # Tokens this process routed to each expert, when a profiler asks (set to zeros to count):
        # the routing skew that decides the busiest EP rank's work, a property of weights and prompt.
        self.routed_counts: Tensor | None = None

    def route(self, t: Tensor) -> tuple[Tensor, Tensor]:
        """Top-k expert ids [T, k] and their gates [T, k] for tokens t [T, dim]."""
        scores, idx = self.router(t).topk(self.top_k, dim=-1)
        return idx, torch.sigmoid(scores)

    def choose(self, t: Tensor) -> tuple[Tensor, Tensor]:
        """`route`, counted where a profiler asks: the dispatchers call this, so a route replaced
        after construction (a fault's hot expert) is what the counts hold."""
        idx, w = self.route(t)
        if self.routed_counts is not None:
            self.routed_counts += torch.bincount(idx.reshape(-1), minlength=self.n_experts)
        return idx, w

    def combine(self, t: Tensor, token: Tensor, y: Tensor, w: Tensor) -> Tensor:
        """Gate-weighted expert outputs y (one row per (token, choice)) summed per token of t, plus
        the shared expert, reduced over TP."""
        routed = torch.zeros_like(t).index_add_(0, token, y * w.reshape(-1, 1))
        return self.reduce(routed + self.shared(t))

    def expert_ffn(self, rows: Tensor, local_expert: Tensor) -> Tensor:
        """Row i through held expert local_expert[i]; rows are grouped by expert so each runs one matmul."""
        order = torch.argsort(local_expert, stable=True)
        counts = torch.bincount(local_expert, minlength=self.w1.shape[0]).tolist()
        xs = rows[order]
        out = torch.empty_like(xs)
        off = 0
        for j, c in enumerate(counts):
            if c:
                h = xs[off:off + c]
                out[off:off + c] = (F.silu(h @ self.w1[j].T) * (h @ self.w3[j].T)) @ self.w2[j].T
            off += c
        y = torch.empty_like(out)
        y[order] = out
        return y

    def forward(self, x: Tensor) -> Tensor:
        b, s, d = x.shape
        return self.dispatch(self, x.reshape(-1, d)).view(b, s, d)
