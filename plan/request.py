"""`commprobe plan` as one checked request: the layout, workload, hardware and options a user
typed, validated when built, and `run()` giving the base prediction and its alternatives."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .costmodel import ALLREDUCE_ALGORITHMS, Layout, Options, Prediction, Workload, predict
from .hardware import Hardware, PlanError, load_hardware
from .whatif import alternatives


@dataclass
class PlanRequest:
    """One planned deployment; a ValueError (PlanError included) with one line for bad input."""

    model: str = "llama3-70b"
    """Model preset (reference_impl/config.py)."""
    hardware: str = "h100x8"
    """Hardware profile name (plan/hardware/*.toml) or a .toml path."""
    tp: int = 8
    """Tensor-parallel degree."""
    cp: int = 1
    """Context-parallel degree."""
    ep: int = 1
    """Expert-parallel degree."""
    batch: int = 1
    """Sequences per batch."""
    prompt_len: int = 2048
    """New prompt tokens to prefill."""
    cached_len: int = 0
    """Tokens already in the KV cache (multi-turn prefill)."""
    allreduce: str = "ring"
    """TP allreduce algorithm: ring (NCCL/RCCL), dda, dda-oneshot, dda-twoshot."""
    cp_variant: str = "auto"
    """CP prefill: auto, pass-kv, pass-q."""
    overlap_all_to_all: bool = False
    """EP dispatch/combine hidden behind expert compute."""
    expert_imbalance: float = 1.0
    """Rows the busiest EP rank's experts get over the mean (router skew), >= 1."""
    routing_from: str | None = None
    """A profiled MoE bundle: take expert_imbalance for this EP degree from its routed-token counts."""
    what_if: str | None = None
    """Alternatives, e.g. 'allreduce=dda|x0.5, all_to_all=overlap, tp=4,8,16' (whatif.py)."""
    sort: str = "ttit"
    """Sort the what-if table by ttit or ttft."""

    def __post_init__(self) -> None:
        from commprobe.reference_impl.cp_variant import VARIANTS

        if self.sort not in ("ttit", "ttft"):
            raise ValueError("--sort must be ttit or ttft")
        if self.allreduce not in ALLREDUCE_ALGORITHMS or self.cp_variant not in VARIANTS:
            raise ValueError("--allreduce: ring, dda, dda-oneshot, dda-twoshot; --cp-variant: auto, pass-kv, pass-q")
        for name, v in (("--batch", self.batch), ("--prompt-len", self.prompt_len)):
            if v < 1:
                raise ValueError(f"{name} must be >= 1")

    def _imbalance(self, w: Workload) -> float:
        if self.expert_imbalance < 1.0:
            raise ValueError("--expert-imbalance must be >= 1 (the busiest rank gets at least the mean)")
        if not self.routing_from:
            return self.expert_imbalance
        from .calibrate import expert_imbalance, routed_histogram

        hist = routed_histogram(Path(self.routing_from))
        if hist is None:
            raise ValueError(f"{self.routing_from}: no routed-token counts (not an MoE run, or profiled before "
                             "they were recorded)")
        if hist.shape[1] != w.model.n_experts:
            raise ValueError(f"{self.routing_from}: routes over {hist.shape[1]} experts, {self.model} has "
                             f"{w.model.n_experts}")
        return expert_imbalance(hist, self.ep)

    def run(self) -> tuple[Hardware, Prediction, list[tuple[str, Prediction]], list[str]]:
        """(hardware, base prediction, [(alternative, prediction)], [skipped alternatives])."""
        from commprobe.reference_impl.config import get_preset

        hw = load_hardware(self.hardware)
        w = Workload(get_preset(self.model), batch=self.batch, prompt_len=self.prompt_len, cached_len=self.cached_len)
        lay = Layout(self.tp, self.cp, self.ep)
        opt = Options(allreduce=self.allreduce, cp_variant=self.cp_variant, overlap_all_to_all=self.overlap_all_to_all,
                      expert_imbalance=self._imbalance(w))
        base = predict(w, lay, hw, opt)
        rows, skipped = alternatives(w, lay, hw, opt, self.what_if) if self.what_if else ([], [])
        return hw, base, rows, skipped


PLAN_SCHEMA = "commprobe.plan/1"


def plan_doc(hw: Hardware, model: str, base: Prediction, rows: list[tuple[str, Prediction]], skipped: list[str]) -> dict:
    """`commprobe plan --json`'s result, which `commprobe report --plan` reads back."""
    return {"schema": PLAN_SCHEMA, "hardware": hw.name, "model": model, "base": base.to_dict(),
            "what_if": [{"alternative": n, **p.to_dict()} for n, p in rows], "skipped": skipped}


def load_plan_doc(path: str | Path) -> dict:
    """A plan result written by `commprobe plan --json`; PlanError naming the file otherwise."""
    import json

    try:
        doc = json.loads(Path(path).read_text())
        if not isinstance(doc, dict) or doc.get("schema") != PLAN_SCHEMA:
            raise ValueError(f"not a {PLAN_SCHEMA} result")
    except (OSError, ValueError) as e:
        raise PlanError(f"{path}: not a plan result from `commprobe plan --json` ({e})") from None
    return doc
