"""A Llama-style decoder in one readable file (in the spirit of gpt-fast).

RMSNorm, rotary embeddings (Hugging Face's rotate-half layout, so HF checkpoints load
unpermuted), grouped-query attention with a preallocated KV cache, SwiGLU MLP.

The model knows nothing about parallelism. Each block has a `reduce` hook that is the
identity on one process; a parallel plan (`reference_impl.tp`) shards the weights and
points the hook at a `Comm` allreduce. Prefill and decode are separate entry points
because they are profiled separately: prefill is compute-bound, decode bandwidth-bound.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig

Reduce = Callable[[Tensor], Tensor]


def _identity(x: Tensor) -> Tensor:
    return x


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


class KVCache(nn.Module):
    def __init__(self, batch: int, n_kv_heads: int, max_seq: int, head_dim: int, dtype: torch.dtype):
        super().__init__()
        shape = (batch, n_kv_heads, max_seq, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype), persistent=False)

    def update(self, start: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        end = start + k.shape[2]
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        self.kv_cache: KVCache | None = None
        self.reduce: Reduce = _identity

    def forward(self, x: Tensor, start: int, cos: Tensor, sin: Tensor) -> Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(start, k, v)
        rep = self.n_heads // self.n_kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        # Causal mask with an offset: query at position start+i sees keys 0..start+i.
        q_pos = torch.arange(start, start + s).unsqueeze(1)
        mask = torch.arange(k.shape[2]).unsqueeze(0) <= q_pos
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim)
        return self.reduce(self.wo(y))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.intermediate_size, bias=False)  # gate
        self.w3 = nn.Linear(cfg.dim, cfg.intermediate_size, bias=False)  # up
        self.w2 = nn.Linear(cfg.intermediate_size, cfg.dim, bias=False)  # down
        self.reduce: Reduce = _identity

    def forward(self, x: Tensor) -> Tensor:
        return self.reduce(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention = Attention(cfg)
        self.feed_forward = FeedForward(cfg)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x: Tensor, start: int, cos: Tensor, sin: Tensor) -> Tensor:
        h = x + self.attention(self.attention_norm(x), start, cos, sin)
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

    def setup_cache(self, batch: int, max_seq: int | None = None) -> None:
        """(Re)allocate the KV caches; call again to start a new sequence."""
        max_seq = max_seq or self.cfg.max_seq_len
        dtype = self.output.weight.dtype
        for layer in self.layers:
            a = layer.attention
            a.kv_cache = KVCache(batch, a.n_kv_heads, max_seq, a.head_dim, dtype)
        self._rope = rope_cache(self.cfg, max_seq, dtype)

    def forward(self, tokens: Tensor, start: int) -> Tensor:
        assert self._rope is not None, "call setup_cache() first"
        s = tokens.shape[1]
        cos, sin = self._rope[0][start:start + s], self._rope[1][start:start + s]
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, start, cos, sin)
        return self.output(self.norm(x))

    def prefill(self, tokens: Tensor) -> Tensor:
        """Whole prompt at once; returns logits for every prompt position."""
        return self(tokens, 0)

    def decode_step(self, token: Tensor, pos: int) -> Tensor:
        """One token per sequence at position `pos`; returns logits [B, 1, V]."""
        return self(token.view(-1, 1), pos)


def build_model(cfg: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32) -> Transformer:
    """Seeded random weights (std 0.02 like GPT-2/Llama init) so every rank builds the same model."""
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
    return model.to(dtype).eval()


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
