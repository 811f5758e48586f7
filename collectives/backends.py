"""Choose a `Comm` implementation by name: gloo, nccl, rccl, dda, auto."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .comm import Comm, TorchComm

BACKENDS = ("auto", "gloo", "nccl", "rccl", "dda")


def process_group_backend(name: str) -> str:
    """The torch.distributed backend a run must initialise for a commprobe backend name."""
    if name in ("nccl", "rccl"):
        return "nccl"  # RCCL is torch's nccl backend on ROCm builds
    if name == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if name == "dda":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return "gloo"


def make_comm(backend: str, axis: str, group: dist.ProcessGroup | None = None, ranks: list[int] | None = None,
              **dda_options) -> Comm:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
    if backend == "dda":
        if torch.cuda.is_available():
            from .dda_symm import SymmMemDDAComm

            return SymmMemDDAComm(axis, group, ranks, **dda_options)
        from .dda import DDAComm

        return DDAComm(axis, group, ranks, **dda_options)
    if backend == "rccl" and not torch.version.hip:
        raise ValueError("backend 'rccl' needs a ROCm build of torch (torch.version.hip is unset)")
    return TorchComm(axis, group, ranks)
