"""A Llama-style decoder in one readable file (in the spirit of gpt-fast).

RMSNorm, rotary embeddings (Hugging Face's rotate-half layout, so HF checkpoints load
unpermuted), grouped-query attention with a preallocated KV cache, SwiGLU MLP.

The model knows nothing about parallelism. It offers three hooks that are trivial on one
process and that the parallel plans rebind (torchtitan keeps plans apart from the model
the same way):
- each block's `reduce` (identity; `reference_impl.tp` points it at a TP allreduce);
- each attention's `core` (local causal attention over the KV cache; `reference_impl.cp`
  swaps in ring attention);
- the MoE layer's `dispatch` (local experts; `reference_impl.ep` swaps in all-to-all).
Tokens carry explicit positions rather than a start offset, because context parallelism
gives each rank non-contiguous, load-balanced chunks of the sequence. Prefill and decode
are separate entry points because they are profiled separately: prefill is compute-bound,
decode bandwidth-bound.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .mlp import FeedForward, Reduce, identity
from .moe import MoE


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_cache(cfg: ModelConfig, seq_len: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [B, H, S, hd]; cos/sin: [S, hd] for the positions of x."""
    return x * cos + _rotate_half(x) * sin


NO_POS = 1 << 62  # position of an empty or padding cache slot: no query (causal mask) ever sees it


class KVCache(nn.Module):
    """Preallocated K/V slots filled in order; `pos` holds each slot's token position.

    On one process slot i holds position i. Under context parallelism a rank's slots hold
    its own, non-contiguous positions, so the causal mask is built from `pos`, not slot order.
    """

    def __init__(self, batch: int, n_kv_heads: int, slots: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu"):
        super().__init__()
        shape = (batch, n_kv_heads, slots, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("pos", torch.full((slots,), NO_POS, dtype=torch.long, device=device), persistent=False)
        self.used = 0

    def write(self, slot: int, k: Tensor, v: Tensor, pos: Tensor | None = None) -> None:
        end = slot + k.shape[2]
        if end > self.k.shape[2]:
            raise ValueError(f"KV cache full: {end} slots needed, {self.k.shape[2]} allocated (call setup_cache with a larger max_seq)")
        self.k[:, :, slot:end] = k
        self.v[:, :, slot:end] = v
        if pos is not None:
            self.pos[slot:end] = pos
        self.used = max(self.used, end)

    def append(self, k: Tensor, v: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Store k/v for positions `pos`; return every filled slot's (k, v, pos)."""
        self.write(self.used, k, v, pos)
        return self.k[:, :, :self.used], self.v[:, :, :self.used], self.pos[:self.used]


def repeat_kv(x: Tensor, rep: int) -> Tensor:
    """Grouped-query attention: each KV head serves `rep` query heads."""
    return x if rep == 1 else x.repeat_interleave(rep, dim=1)


def local_attention(attn: Attention, q: Tensor, k: Tensor, v: Tensor, pos: Tensor) -> Tensor:
    """The default attention core: append to this process's KV cache, causal attention over it."""
    if attn.kv_cache is not None:
        k, v, k_pos = attn.kv_cache.append(k, v, pos)
    else:
        k_pos = pos
    rep = attn.n_heads // attn.n_kv_heads
    mask = k_pos.unsqueeze(0) <= pos.unsqueeze(1)  # query at position p sees keys at positions <= p
    return F.scaled_dot_product_attention(q, repeat_kv(k, rep), repeat_kv(v, rep), attn_mask=mask)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        self.kv_cache: KVCache | None = None
        self.reduce: Reduce = identity
        self.core: Callable[..., Tensor] = local_attention

    def forward(self, x: Tensor, pos: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = self.core(self, q, k, v, pos)
        y = y.transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim)
        return self.reduce(self.wo(y))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention = Attention(cfg)
        self.feed_forward: nn.Module = MoE(cfg) if cfg.n_experts else FeedForward(cfg)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x: Tensor, pos: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        h = x + self.attention(self.attention_norm(x), pos, cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self._rope: tuple[Tensor, Tensor] | None = None

    def setup_cache(self, batch: int, max_seq: int | None = None, slots: int | None = None) -> None:
        """(Re)allocate the KV caches; call again to start a new sequence.

        `max_seq` bounds positions (the rotary table); `slots` the tokens this process keeps
        (fewer than `max_seq` when context parallelism shards the cache).
        """
        max_seq = max_seq or self.cfg.max_seq_len
        dtype, device = self.output.weight.dtype, self.output.weight.device
        for layer in self.layers:
            a = layer.attention
            a.kv_cache = KVCache(batch, a.n_kv_heads, slots or max_seq, a.head_dim, dtype, device)
        cos, sin = rope_cache(self.cfg, max_seq, dtype)
        self._rope = (cos.to(device), sin.to(device))

    def hidden(self, tokens: Tensor, pos: Tensor | int) -> Tensor:
        """Final-norm hidden states for `tokens` at positions `pos` (a start offset or one per token)."""
        assert self._rope is not None, "call setup_cache() first"
        if isinstance(pos, int):
            pos = torch.arange(pos, pos + tokens.shape[1], device=tokens.device)
        rp = pos.clamp(0, self._rope[0].shape[0] - 1)  # padding tokens carry out-of-range positions
        cos, sin = self._rope[0][rp], self._rope[1][rp]
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, pos, cos, sin)
        return self.norm(x)

    def forward(self, tokens: Tensor, pos: Tensor | int) -> Tensor:
        return self.output(self.hidden(tokens, pos))

    def prefill(self, tokens: Tensor, start: int = 0) -> Tensor:
        """Whole prompt at once (after `start` tokens already cached: multi-turn); logits for every prompt position."""
        return self(tokens, start)

    def decode_step(self, token: Tensor, pos: int) -> Tensor:
        """One token per sequence at position `pos`; returns logits [B, 1, V]."""
        return self(token.view(-1, 1), pos)


def build_model(cfg: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu") -> Transformer:
    """Seeded random weights (std 0.02 like GPT-2/Llama init) so every rank builds the same model.

    Drawn on the CPU (the same numbers on any device), then moved to `device`."""
    gen = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        model = Transformer(cfg)
    model = model.to_empty(device="cpu")
    for name, p in model.named_parameters():
        with torch.no_grad():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return model.to(device=device, dtype=dtype).eval()


def greedy_generate(model: Transformer, prompt: Tensor, steps: int) -> tuple[Tensor, Tensor]:
    """Prefill then `steps` greedy decode steps. Returns (prefill logits, generated tokens [B, steps])."""
    b, s = prompt.shape
    model.setup_cache(b, s + steps)
    logits = model.prefill(prompt)
    tok = logits[:, -1].argmax(-1)
    out = [tok]
    for i in range(steps - 1):
        tok = model.decode_step(tok, s + i)[:, -1].argmax(-1)
        out.append(tok)
    return logits, torch.stack(out, dim=1)
