"""Reference Llama-style inference model and its parallel plans (TP, CP, EP on one Comm interface).

The model and plans import torch; the shapes (`config`) do not, so the planner and the
analyzers can read a preset on a laptop without torch: the torch parts load on first use.
"""

from .config import PRESETS, ModelConfig, get_preset

__all__ = ["PRESETS", "ModelConfig", "Transformer", "build_model", "get_preset", "greedy_generate"]


def __getattr__(name: str):
    if name in ("Transformer", "build_model", "greedy_generate"):
        from . import model

        return getattr(model, name)
    raise AttributeError(name)
