"""Reference Llama-style inference model and its parallel plans (TP now; CP and EP build on the same Comm)."""

from .config import PRESETS, ModelConfig, get_preset
from .model import Transformer, build_model, greedy_generate

__all__ = ["PRESETS", "ModelConfig", "Transformer", "build_model", "get_preset", "greedy_generate"]
