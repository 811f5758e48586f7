"""Hugging Face Llama checkpoints (config.json + *.safetensors) in and out.

Our rotary layout is HF's rotate-half, so q/k projections need no permutation: a name
map is all there is. Sharded checkpoints (several .safetensors files) are read file by
file; tensors we do not know are an error rather than silently ignored.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .config import ModelConfig
from .model import Transformer

_LAYER_MAP = {
    "self_attn.q_proj.weight": "attention.wq.weight",
    "self_attn.k_proj.weight": "attention.wk.weight",
    "self_attn.v_proj.weight": "attention.wv.weight",
    "self_attn.o_proj.weight": "attention.wo.weight",
    "mlp.gate_proj.weight": "feed_forward.w1.weight",
    "mlp.up_proj.weight": "feed_forward.w3.weight",
    "mlp.down_proj.weight": "feed_forward.w2.weight",
    "input_layernorm.weight": "attention_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}
_TOP_MAP = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
}


class CheckpointError(ValueError):
    pass


def config_from_hf(path: Path) -> ModelConfig:
    try:
        hf = json.loads((path / "config.json").read_text())
        return ModelConfig(
            name=path.name,
            vocab_size=hf["vocab_size"],
            dim=hf["hidden_size"],
            n_layers=hf["num_hidden_layers"],
            n_heads=hf["num_attention_heads"],
            n_kv_heads=hf.get("num_key_value_heads", hf["num_attention_heads"]),
            intermediate_size=hf["intermediate_size"],
            norm_eps=hf.get("rms_norm_eps", 1e-5),
            rope_theta=hf.get("rope_theta", 10000.0),
            max_seq_len=hf.get("max_position_embeddings", 2048),
        )
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no config.json") from None
    except (KeyError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}/config.json: unreadable or missing field {e}") from None


def _hf_to_ours(name: str) -> str:
    if name in _TOP_MAP:
        return _TOP_MAP[name]
    parts = name.split(".", 3)  # model.layers.{i}.rest
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in _LAYER_MAP:
        return f"layers.{parts[2]}.{_LAYER_MAP[parts[3]]}"
    raise CheckpointError(f"unknown tensor {name!r} in checkpoint")


def load_hf(path: str | Path, dtype: torch.dtype = torch.float32) -> Transformer:
    path = Path(path)
    cfg = config_from_hf(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no .safetensors files")
    with torch.device("meta"):
        model = Transformer(cfg)
    model = model.to_empty(device="cpu")
    state = {}
    for f in files:
        for k, v in load_file(str(f)).items():
            if k.endswith("rotary_emb.inv_freq"):
                continue
            state[_hf_to_ours(k)] = v.to(dtype)
    if "output.weight" not in state and "tok_embeddings.weight" in state:  # tied embeddings
        state["output.weight"] = state["tok_embeddings.weight"]
    missing = set(model.state_dict()) - set(state)
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks {sorted(missing)[0]} (and {len(missing) - 1} more)")
    model.load_state_dict(state)
    return model.to(dtype).eval()


def save_hf(model: Transformer, path: str | Path) -> None:
    """Write `model` as an HF-format directory (used by tests and to export a seeded model)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    inv_top = {v: k for k, v in _TOP_MAP.items()}
    inv_layer = {v: k for k, v in _LAYER_MAP.items()}
    out = {}
    for name, t in model.state_dict().items():
        if name in inv_top:
            out[inv_top[name]] = t.contiguous()
        else:
            _, i, rest = name.split(".", 2)
            out[f"model.layers.{i}.{inv_layer[rest]}"] = t.contiguous()
    save_file(out, str(path / "model.safetensors"))
    c = model.cfg
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": c.vocab_size, "hidden_size": c.dim, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "intermediate_size": c.intermediate_size, "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta, "max_position_embeddings": c.max_seq_len,
    }, indent=2))
