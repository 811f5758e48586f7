"""Expert-parallel plan: experts sharded over an EP group, tokens dispatched by all-to-all.

Hidden states are replicated across the EP group (as after a TP allreduce), so each EP rank
takes a contiguous 1/N slice of the tokens, routes it, and:
1. exchanges per-expert counts (all-to-all of a small int tensor), so every rank knows how
   many rows it will receive for each of its experts;
2. **dispatch**: all-to-all of the token rows, sorted by expert, with variable split sizes;
3. runs its experts on what it received (an expert may receive nothing);
4. **combine**: all-to-all of the outputs back to the token's rank, which weights them by
   the gates and adds the shared expert;
5. reduces over TP (when experts are also TP-sharded) and all-gathers the slices over EP so
   the hidden states are replicated again.
"""

from __future__ import annotations

import torch
from torch import Tensor

from commprobe.collectives.comm import Comm

from .config import ModelConfig
from .model import Transformer
from .moe import MoE


def check_ep(cfg: ModelConfig, ep: int) -> None:
    if ep < 1:
        raise ValueError(f"--ep must be >= 1, got {ep}")
    if ep == 1:
        return
    if not cfg.n_experts:
        raise ValueError(f"--ep {ep} needs a mixture-of-experts preset (moe-tiny, moe-small); {cfg.name!r} is dense")
    if cfg.n_experts % ep:
        raise ValueError(f"--ep {ep} does not divide the {cfg.n_experts} experts of preset {cfg.name!r}")


class EPDispatch:
    """The MoE `dispatch` hook for one EP group."""

    def __init__(self, comm: Comm):
        self.comm = comm

    def __call__(self, moe: MoE, t: Tensor) -> Tensor:
        comm, n, r = self.comm, self.comm.world_size, self.comm.rank
        total, d = t.shape
        per_rank = -(-total // n)
        lo, hi = min(r * per_rank, total), min((r + 1) * per_rank, total)
        mine = t[lo:hi]
        idx, w = moe.choose(mine)
        k = idx.shape[1]
        token = torch.arange(mine.shape[0], device=t.device).repeat_interleave(k)
        expert = idx.reshape(-1)
        order = torch.argsort(expert, stable=True)  # rows sorted by expert = grouped by owning rank
        per_e = moe.n_experts // n
        send_counts = torch.bincount(expert, minlength=moe.n_experts).view(n, per_e)
        recv_counts = comm.all_to_all(send_counts, [1] * n, [1] * n)  # [n, per_e]: from each rank, per my expert
        in_splits, out_splits = send_counts.sum(1).tolist(), recv_counts.sum(1).tolist()
        got = comm.all_to_all(mine[token[order]], in_splits, out_splits)  # dispatch
        local = torch.arange(per_e, device=t.device).repeat(n).repeat_interleave(recv_counts.reshape(-1))
        back = comm.all_to_all(moe.expert_ffn(got, local), out_splits, in_splits)  # combine
        y = torch.empty_like(back)
        y[order] = back
        out = moe.combine(mine, token, y, w)
        padded = out.new_zeros((per_rank, d))
        padded[:out.shape[0]] = out
        return comm.all_gather(padded)[:total]


def apply_ep(model: Transformer, comm: Comm) -> Transformer:
    """Keep this rank's contiguous slice of every MoE layer's experts and dispatch over `comm`."""
    n, r = comm.world_size, comm.rank
    check_ep(model.cfg, n)
    if n == 1:
        return model
    dispatch = EPDispatch(comm)
    for block in model.layers:
        moe = block.feed_forward
        if not isinstance(moe, MoE):
            continue
        per = moe.n_experts // n
        for name in ("w1", "w3", "w2"):
            p = getattr(moe, name)
            setattr(moe, name, torch.nn.Parameter(p.data[r * per:(r + 1) * per].clone(), requires_grad=False))
        moe.first_expert = r * per
        moe.dispatch = dispatch
    return model
