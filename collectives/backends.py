"""Backend names, resolved in one place: which `Comm` a name means and which torch.distributed
backend a run must initialise for it. The CLI, the launcher, the benchmarks and the ranks
all ask here."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

from commprobe.common.vocab import PROFILE_BACKENDS

from .comm import Comm, TorchComm

BACKENDS = PROFILE_BACKENDS


def _gpu() -> bool:
    return torch.cuda.is_available()


def resolve_backends(spec: str | Iterable[str], known: Iterable[str] = BACKENDS) -> list[str]:
    """'auto,dda' -> ['gloo', 'dda'] on a CPU host (['nccl', 'dda'] with a GPU): names checked
    against `known`, `auto` replaced by this host's library backend, no repeats, at least one.
    ValueError with a one-line reason otherwise."""
    names = [b.strip() for b in (spec.split(",") if isinstance(spec, str) else spec) if b.strip()]
    known = tuple(known)
    for b in names:
        if b not in known:
            raise ValueError(f"unknown backend {b!r} (known: {', '.join(known)})")
    names = [("nccl" if _gpu() else "gloo") if b == "auto" else b for b in names]
    if len(set(names)) != len(names) or not names:
        raise ValueError("--backend lists a backend twice, or none")
    return names


def process_group_backend(names: str | Iterable[str] = "auto") -> str:
    """The torch.distributed backend a run of these commprobe backends must initialise: nccl
    where one of them runs on GPUs (nccl; rccl, which is torch's nccl backend on ROCm builds;
    dda and auto on a GPU host), else gloo."""
    names = [names] if isinstance(names, str) else list(names)
    gpu_names = ("nccl", "rccl", "auto", "dda") if _gpu() else ("nccl", "rccl")
    return "nccl" if any(n in gpu_names for n in names) else "gloo"


def make_comm(backend: str, axis: str, group: dist.ProcessGroup | None = None, ranks: list[int] | None = None,
              *, timeout: float | None = None, **dda_options) -> Comm:
    """The `Comm` for one axis. `timeout` bounds DDA's waits for peers (the library backends
    have the process group's own)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
    if backend == "dda":
        if timeout is not None:
            dda_options["timeout"] = timeout
        if _gpu():
            from .dda_symm import SymmMemDDAComm

            return SymmMemDDAComm(axis, group, ranks, **dda_options)
        from .dda import DDAComm

        return DDAComm(axis, group, ranks, **dda_options)
    if backend == "rccl" and not torch.version.hip:
        raise ValueError("backend 'rccl' needs a ROCm build of torch (torch.version.hip is unset)")
    return TorchComm(axis, group, ranks)
