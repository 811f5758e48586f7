"""Context-parallel plan: the sequence sharded over a CP group, ring attention, exact LSE merge.

Following Meta's "Context Parallelism for Scalable Million-Token Inference":

**Load balance.** Causal attention makes late tokens cost more than early ones, so a prompt
of P new tokens is cut into 2N chunks and rank i takes chunks i and 2N-1-i (one cheap, one
expensive). When P is not a multiple of 2N the first P mod 2N chunks are one token longer;
shards are padded to one common length L so ring messages have one shape (padding queries
have position -1 and see nothing; padding keys have position NO_POS and are seen by none).

**pass-KV.** Queries stay; each rank's K/V (its whole cache: earlier turns and the new
tokens) travels the ring. N steps: attend the K/V in hand, meanwhile send it on and receive
the next (async send/recv, so the transfer overlaps the attention of that step).

**pass-Q.** K/V stay; the new tokens' queries travel the ring. Each rank attends every
visiting query block to its own cache; the partial outputs and their log-sum-exp go back to
their owner in one all-to-all at the end.

**Merge.** A partial over key set K_j gives o_j and lse_j = log sum_{k in K_j} exp(s_k).
Over all key sets: lse = log sum_j exp(lse_j) and o = sum_j exp(lse_j - lse) * o_j. Exact, in
any order; rows that saw no key have lse_j = -inf and weight 0.

**Choosing** (`auto`). Per ring step pass-KV moves 2 * (T + P)/N * H_kv * d values (K and V
of every cached and new token, T cached) and pass-Q moves P/N * H * d (queries of the new
tokens). pass-Q moves less when

        P * H  <  2 * (T + P) * H_kv     i.e.    P / (T + P)  <  2 * H_kv / H,

so auto picks pass-Q when the new tokens are a small part of the context (multi-turn prefill
on a warm KV cache; for Llama 3 405B, 2 * 8 / 128 = 12.5%) and pass-KV otherwise (always on a
cold cache: P / (T + P) = 1). pass-Q additionally returns its partial outputs once (P/N * H * d
values in the all-to-all), ignored in the rule as Meta's paper does; the paper also checks
whether the transfer hides behind attention compute, which this rule does not model.

**Decode.** The KV cache stays sharded: each new token's K/V is kept by the rank holding the
fewest tokens; every rank attends the (replicated) new query to its own shard and the
partials (output and LSE together, one message) are all-gathered and merged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from commprobe.collectives.comm import Comm
from commprobe.collectives.spans import span

from .cp_variant import VARIANTS, choose_variant
from .model import NO_POS, Attention, Transformer, repeat_kv

SLOT_MARGIN = 64  # padding slots per rank for prefills whose length is not a multiple of 2N


def check_cp(cp: int, variant: str = "auto") -> None:
    if cp < 1:
        raise ValueError(f"--cp must be >= 1, got {cp}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown --cp-variant {variant!r} (known: {', '.join(VARIANTS)})")


def balanced_shards(start: int, length: int, n: int) -> list[Tensor]:
    """Positions of `length` new tokens from `start`, per rank: chunks i and 2n-1-i of 2n."""
    sizes = [length // (2 * n) + (1 if c < length % (2 * n) else 0) for c in range(2 * n)]
    bounds = [start]
    for s in sizes:
        bounds.append(bounds[-1] + s)
    chunk = [torch.arange(bounds[c], bounds[c + 1]) for c in range(2 * n)]
    return [torch.cat([chunk[i], chunk[2 * n - 1 - i]]) for i in range(n)]


def attention_lse(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
    """Causal attention of q [B,H,S,d] over k/v [B,H,T,d] by positions; returns (out, lse [B,H,S])."""
    s = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s.masked_fill(k_pos.unsqueeze(0) > q_pos.unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # rows that see no key: weights 0
    return torch.matmul(torch.exp(s - safe.unsqueeze(-1)), v), lse


def merge_partials(outs: Tensor, lses: Tensor) -> Tensor:
    """outs [N,B,H,S,d], lses [N,B,H,S] -> exact attention over the union of the N key sets."""
    lse = torch.logsumexp(lses, dim=0)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    return (outs * torch.exp(lses - safe).unsqueeze(-1)).sum(0)


def _pack(o: Tensor, lse: Tensor) -> Tensor:
    return torch.cat([o, lse.unsqueeze(-1).to(o.dtype)], dim=-1)


def _merge_packed(p: Tensor) -> Tensor:
    return merge_partials(p[..., :-1], p[..., -1].float()).to(p.dtype)


@dataclass
class _Prefill:
    variant: str
    q_pos: Tensor  # [N, L] positions of each rank's new tokens, -1 for padding
    slot0: list[int]  # where each rank writes its new K/V


@dataclass
class _Decode:
    owner: int
    slot: int


class ContextParallel:
    """Wraps a (possibly TP-sharded) model: `setup_cache`, `prefill`, `decode_step` as the model has.

    Every rank keeps the same table of which positions each rank's cache slots hold, so the
    ring needs to move only K/V (or Q), never positions.
    """

    def __init__(self, model: Transformer, comm: Comm, variant: str = "auto"):
        check_cp(comm.world_size, variant)
        self.model, self.comm, self.variant = model, comm, variant
        self.cfg = model.cfg
        self.last_variant: str | None = None
        self._step: _Prefill | _Decode | None = None
        for block in model.layers:
            block.attention.core = self._core

    def setup_cache(self, batch: int, max_seq: int | None = None) -> None:
        n = self.comm.world_size
        max_seq = max_seq or self.cfg.max_seq_len
        slots = -(-max_seq // n) + SLOT_MARGIN
        self.model.setup_cache(batch, max_seq, slots)
        self.device = self.model.output.weight.device
        self.table = torch.full((n, slots), NO_POS, dtype=torch.long, device=self.device)
        self.used = [0] * n  # slots filled, padding included
        self.held = [0] * n  # real tokens held

    # ---- entry points ----

    def prefill(self, tokens: Tensor, start: int = 0) -> Tensor:
        """Logits for every new token, on every rank (the shards' hidden states are all-gathered)."""
        n, r = self.comm.world_size, self.comm.rank
        b, length = tokens.shape
        shards = balanced_shards(start, length, n)
        width = max(len(s) for s in shards)
        q_pos = torch.full((n, width), -1, dtype=torch.long)
        for i, s in enumerate(shards):
            q_pos[i, :len(s)] = s
        q_pos = q_pos.to(self.device)
        k_pos = torch.where(q_pos < 0, NO_POS, q_pos)
        variant = self.variant
        if variant == "auto":
            a = self.model.layers[0].attention
            variant = choose_variant(sum(self.held), length, a.n_heads, a.n_kv_heads)
        self.last_variant = variant
        slot0 = list(self.used)
        for i in range(n):
            if slot0[i] + width > self.table.shape[1]:
                raise ValueError(f"CP rank {i}'s KV cache is full (call setup_cache with a larger max_seq)")
            self.table[i, slot0[i]:slot0[i] + width] = k_pos[i]
            self.used[i] += width
            self.held[i] += len(shards[i])
        local = torch.zeros((b, width), dtype=tokens.dtype, device=tokens.device)
        local[:, :len(shards[r])] = tokens[:, (shards[r] - start).to(tokens.device)]
        self._step = _Prefill(variant, q_pos, slot0)
        h = self.model.hidden(local, q_pos[r])
        gathered = self.comm.all_gather(h.transpose(0, 1).contiguous())  # [N*L, B, dim], rank-major
        flat = q_pos.reshape(-1)
        rows = torch.nonzero(flat >= 0).squeeze(1)
        rows = rows[torch.argsort(flat[rows])]
        return self.model.output(gathered[rows].transpose(0, 1))

    def decode_step(self, token: Tensor, pos: int) -> Tensor:
        owner = min(range(self.comm.world_size), key=lambda i: (self.held[i], i))
        slot = self.used[owner]
        if slot >= self.table.shape[1]:
            raise ValueError(f"CP rank {owner}'s KV cache is full (call setup_cache with a larger max_seq)")
        self.table[owner, slot] = pos
        self.used[owner] += 1
        self.held[owner] += 1
        self._step = _Decode(owner, slot)
        return self.model(token.view(-1, 1), pos)

    # ---- the attention core every layer calls ----

    def _core(self, attn: Attention, q: Tensor, k: Tensor, v: Tensor, pos: Tensor) -> Tensor:
        st, cache, r = self._step, attn.kv_cache, self.comm.rank
        rep = attn.n_heads // attn.n_kv_heads
        if isinstance(st, _Decode):
            if r == st.owner:
                cache.write(st.slot, k, v)
            used = self.used[r]
            o, lse = attention_lse(q, repeat_kv(cache.k[:, :, :used], rep), repeat_kv(cache.v[:, :, :used], rep),
                                   pos, self.table[r, :used])
            return _merge_packed(self.comm.all_gather(_pack(o, lse).unsqueeze(0)))
        cache.write(st.slot0[r], k, v)
        if st.variant == "pass-kv":
            return self._pass_kv(cache, q, pos, rep)
        return self._pass_q(cache, q, st.q_pos, rep)

    def _pass_kv(self, cache, q: Tensor, q_pos: Tensor, rep: int) -> Tensor:
        n, r = self.comm.world_size, self.comm.rank
        width = max(self.used)
        kv = torch.stack([cache.k[:, :, :width], cache.v[:, :, :width]])
        outs, lses = [], []
        for j in range(n):
            src = (r - j) % n  # whose K/V is in hand at step j
            pending = self.comm.send_recv_start(kv, (r + 1) % n, (r - 1) % n) if j < n - 1 else None
            with span(f"commprobe/cp/pass-kv/step={j}"):
                o, lse = attention_lse(q, repeat_kv(kv[0], rep), repeat_kv(kv[1], rep), q_pos, self.table[src, :width])
            outs.append(o)
            lses.append(lse)
            if pending is not None:
                kv = pending.wait()
        return merge_partials(torch.stack(outs), torch.stack(lses))

    def _pass_q(self, cache, q: Tensor, q_pos: Tensor, rep: int) -> Tensor:
        n, r = self.comm.world_size, self.comm.rank
        used = self.used[r]
        k, v, k_pos = repeat_kv(cache.k[:, :, :used], rep), repeat_kv(cache.v[:, :, :used], rep), self.table[r, :used]
        parts: list[Tensor] = [q] * n
        qv = q.contiguous()
        for j in range(n):
            owner = (r - j) % n  # whose queries are in hand at step j
            pending = self.comm.send_recv_start(qv, (r + 1) % n, (r - 1) % n) if j < n - 1 else None
            with span(f"commprobe/cp/pass-q/step={j}"):
                o, lse = attention_lse(qv, k, v, q_pos[owner], k_pos)
            parts[owner] = _pack(o, lse)
            if pending is not None:
                qv = pending.wait()
        back = self.comm.all_to_all(torch.stack(parts), [1] * n, [1] * n)  # back[j]: my queries against rank j's K/V
        return _merge_packed(back)
