"""The reference model on one process: shapes, KV-cache consistency, checkpoints."""

import pytest
import torch

from commprobe.reference_impl.checkpoint import CheckpointError, load_hf, save_hf
from commprobe.reference_impl.config import PRESETS, get_preset
from commprobe.reference_impl.model import build_model, greedy_generate
from commprobe.reference_impl.tp import check_tp


def test_decode_with_cache_equals_full_forward():
    """Logits of a decode step at position p equal the prefill logits of the whole sequence at p."""
    model = build_model(get_preset("tiny"), seed=3)
    prompt = torch.randint(0, 256, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        _, toks = greedy_generate(model, prompt, 6)
        full = torch.cat([prompt, toks[:, :-1]], dim=1)
        model.setup_cache(2, full.shape[1])
        ref = model.prefill(full)
        model.setup_cache(2, full.shape[1])
        model.prefill(prompt)
        for i in range(5):
            step = model.decode_step(toks[:, i], prompt.shape[1] + i)[:, -1]
            assert (step - ref[:, prompt.shape[1] + i]).abs().max() < 1e-5


def test_presets_have_published_shapes():
    c = PRESETS["llama3-70b"]
    assert (c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.intermediate_size) == (8192, 80, 64, 8, 28672)
    assert 69e9 < c.param_count() < 72e9
    assert 7.9e9 < PRESETS["llama3-8b"].param_count() < 8.1e9
    assert 400e9 < PRESETS["llama3-405b"].param_count() < 410e9
    small = PRESETS["small"].param_count() * 4
    assert 200e6 < small < 1e9  # "a few hundred MB" of fp32 weights: decode is bandwidth-bound


def test_check_tp_rejects_non_divisors():
    check_tp(get_preset("tiny"), 4)
    with pytest.raises(ValueError, match="does not divide the 8 attention heads"):
        check_tp(get_preset("tiny"), 3)
    with pytest.raises(ValueError, match="KV heads"):
        check_tp(get_preset("tiny"), 8)
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("nope")


def test_hf_checkpoint_round_trip(tmp_path):
    model = build_model(get_preset("tiny"), seed=7)
    save_hf(model, tmp_path / "ckpt")
    loaded = load_hf(tmp_path / "ckpt")
    prompt = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        a, ta = greedy_generate(model, prompt, 4)
        b, tb = greedy_generate(loaded, prompt, 4)
    assert torch.equal(a, b) and torch.equal(ta, tb)


def test_bad_checkpoints_are_clear(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        load_hf(tmp_path)
    save_hf(build_model(get_preset("tiny")), tmp_path / "c")
    (tmp_path / "c" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no .safetensors"):
        load_hf(tmp_path / "c")
