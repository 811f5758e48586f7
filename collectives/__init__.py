"""Collective backends behind one `Comm` interface: torch.distributed (gloo/nccl) and, later, DDA."""

from .comm import Comm, TorchComm
from .spans import span_name

__all__ = ["Comm", "TorchComm", "span_name"]
