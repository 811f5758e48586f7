"""Tensor-parallel plan, kept apart from the model (as torchtitan does).

Megatron-style: QKV and gate/up are column-parallel (each rank owns whole heads / a slice
of the hidden features), output and down projections are row-parallel, so each block needs
exactly one allreduce after attention and one after the MLP. Embeddings, norms and the
output head stay replicated: they are a small share of decode traffic and keep the plan
to two collectives per layer.
"""

from __future__ import annotations

from torch import nn

from commprobe.collectives.comm import Comm

from .config import ModelConfig
from .model import Transformer
from .moe import MoE


def check_tp(cfg: ModelConfig, tp: int) -> None:
    """Raise ValueError with one readable line when `tp` cannot shard `cfg`."""
    if tp < 1:
        raise ValueError(f"--tp must be >= 1, got {tp}")
    if cfg.n_heads % tp:
        raise ValueError(f"--tp {tp} does not divide the {cfg.n_heads} attention heads of preset {cfg.name!r}")
    if cfg.n_kv_heads % tp:
        raise ValueError(f"--tp {tp} does not divide the {cfg.n_kv_heads} KV heads of preset {cfg.name!r}")
    if cfg.intermediate_size % tp:
        raise ValueError(f"--tp {tp} does not divide the MLP width {cfg.intermediate_size} of preset {cfg.name!r}")
    if cfg.n_experts and cfg.moe_intermediate_size % tp:
        raise ValueError(f"--tp {tp} does not divide the expert width {cfg.moe_intermediate_size} of preset {cfg.name!r}")


def _shard(linear: nn.Linear, dim: int, rank: int, world: int) -> None:
    """Keep this rank's slice of the weight: dim 0 = output features (column-parallel), 1 = input (row-parallel)."""
    w = linear.weight.data
    size = w.shape[dim] // world
    part = w.narrow(dim, rank * size, size).clone()
    linear.weight = nn.Parameter(part, requires_grad=False)
    if dim == 0:
        linear.out_features = size
    else:
        linear.in_features = size


def apply_tp(model: Transformer, comm: Comm) -> Transformer:
    """Shard `model` in place for `comm`'s group and route the two per-block reductions through it."""
    r, n = comm.rank, comm.world_size
    check_tp(model.cfg, n)
    if n == 1:
        return model
    for block in model.layers:
        attn, mlp = block.attention, block.feed_forward
        for lin in (attn.wq, attn.wk, attn.wv):
            _shard(lin, 0, r, n)
        _shard(attn.wo, 1, r, n)
        if isinstance(mlp, MoE):
            # Each expert (and the shared one) is split like the dense MLP; the router stays
            # replicated, so every TP rank routes identically and one allreduce sums the MoE output.
            _shard_experts(mlp, r, n)
            mlp = mlp.shared
        for lin in (mlp.w1, mlp.w3):
            _shard(lin, 0, r, n)
        _shard(mlp.w2, 1, r, n)
        attn.n_heads //= n
        attn.n_kv_heads //= n
    return bind_tp_comm(model, comm)


def _shard_experts(moe: MoE, rank: int, world: int) -> None:
    for name, dim in (("w1", 1), ("w3", 1), ("w2", 2)):
        w = getattr(moe, name).data
        size = w.shape[dim] // world
        setattr(moe, name, nn.Parameter(w.narrow(dim, rank * size, size).clone(), requires_grad=False))


def bind_tp_comm(model: Transformer, comm: Comm) -> Transformer:
    """Point the two per-block reductions at `comm` (switching backends needs no re-sharding)."""
    if comm.world_size == 1:
        return model
    for block in model.layers:
        block.attention.reduce = comm.all_reduce
        block.feed_forward.reduce = comm.all_reduce
    return model


def local_param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())

