"""Model shapes: one dataclass and a few named presets.

`tiny` is for tests (well under a second per forward), `small` is the default for
`commprobe profile` (about 620 MB of fp32 weights, so a single-token decode step on a
2-core host is bound by memory bandwidth, as decode is on a GPU), and the `llama3-*`
presets carry the real published shapes for cost models and GPU runs. The real shapes are
never instantiated in CPU tests: a 70B model does not fit this machine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class ModelConfig:
    name: str = "custom"
    vocab_size: int = 32000
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 8
    intermediate_size: int = 14336
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    max_seq_len: int = 8192
    # Mixture of experts (Llama 4 style): 0 experts = dense MLP. Every block's MLP becomes a
    # router choosing top_k routed experts plus one shared expert, each a SwiGLU of width
    # moe_intermediate_size.
    n_experts: int = 0
    top_k: int = 1
    moe_intermediate_size: int = 0

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def param_count(self) -> int:
        """Parameters, embeddings and output head included (untied)."""
        hd = self.head_dim
        attn = self.dim * (self.n_heads * hd) * 2 + self.dim * (self.n_kv_heads * hd) * 2
        if self.n_experts:
            mlp = 3 * self.dim * self.moe_intermediate_size * (self.n_experts + 1) + self.dim * self.n_experts
        else:
            mlp = 3 * self.dim * self.intermediate_size
        per_layer = attn + mlp + 2 * self.dim
        return self.n_layers * per_layer + 2 * self.vocab_size * self.dim + self.dim

    def validate(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        if self.n_experts and not (1 <= self.top_k <= self.n_experts and self.moe_intermediate_size > 0):
            raise ValueError(f"MoE needs 1 <= top_k <= n_experts and moe_intermediate_size > 0 (got top_k {self.top_k}, "
                             f"{self.n_experts} experts, width {self.moe_intermediate_size})")

    def to_dict(self) -> dict:
        return asdict(self)

    def with_(self, **kw) -> ModelConfig:
        return replace(self, **kw)


PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        name="tiny", vocab_size=256, dim=64, n_layers=2, n_heads=8, n_kv_heads=4,
        intermediate_size=128, rope_theta=10000.0, max_seq_len=256,
    ),
    "small": ModelConfig(
        name="small", vocab_size=32000, dim=1024, n_layers=8, n_heads=16, n_kv_heads=8,
        intermediate_size=2816, rope_theta=10000.0, max_seq_len=2048,
    ),
    # Mixture-of-experts shapes for tests (moe-tiny) and `commprobe profile --ep` (moe-small).
    "moe-tiny": ModelConfig(
        name="moe-tiny", vocab_size=256, dim=64, n_layers=2, n_heads=8, n_kv_heads=4,
        intermediate_size=128, rope_theta=10000.0, max_seq_len=256,
        n_experts=4, top_k=1, moe_intermediate_size=64,
    ),
    # Experts wide enough that the tokens routed to one cost real time (a hot expert's rank is
    # measurably late: `commprobe bench diagnosis`), the rest tiny so a run takes seconds.
    "moe-wide": ModelConfig(
        name="moe-wide", vocab_size=256, dim=256, n_layers=2, n_heads=8, n_kv_heads=4,
        intermediate_size=512, rope_theta=10000.0, max_seq_len=512,
        n_experts=4, top_k=1, moe_intermediate_size=4096,
    ),
    "moe-small": ModelConfig(
        name="moe-small", vocab_size=32000, dim=1024, n_layers=4, n_heads=16, n_kv_heads=8,
        intermediate_size=2816, rope_theta=10000.0, max_seq_len=2048,
        n_experts=8, top_k=1, moe_intermediate_size=1408,
    ),
    # Published shapes (Llama 3 / 3.1 model cards).
    "llama3-8b": ModelConfig(
        name="llama3-8b", vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8,
        intermediate_size=14336, rope_theta=500000.0, max_seq_len=131072,
    ),
    "llama3-70b": ModelConfig(
        name="llama3-70b", vocab_size=128256, dim=8192, n_layers=80, n_heads=64, n_kv_heads=8,
        intermediate_size=28672, rope_theta=500000.0, max_seq_len=131072,
    ),
    "llama3-405b": ModelConfig(
        name="llama3-405b", vocab_size=128256, dim=16384, n_layers=126, n_heads=128, n_kv_heads=8,
        intermediate_size=53248, rope_theta=500000.0, max_seq_len=131072,
    ),
}


def get_preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})") from None
