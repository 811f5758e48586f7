"""DDA on GPUs over torch symmetric memory (experimental: not yet checked on a lent GPU).

Peers' buffers are mapped into every rank's address space (CUDA IPC / NVLink on NVIDIA,
the ROCm equivalent on AMD) and torch ships the one-shot and two-shot kernels that read
them directly: `torch.ops.symm_mem.one_shot_all_reduce_out` and `two_shot_all_reduce_`.
We keep one persistent symmetric buffer per group (as vLLM's SymmMemCommunicator does),
copy the input in, run the kernel that fits the size, and fall back to the NCCL group for
messages larger than the buffer and for the other collectives.
"""

from __future__ import annotations

import importlib

import torch
import torch.distributed as dist
from torch import Tensor

from .comm import TorchComm
from .spans import comm_span


def symm_mem_unavailable_reason() -> str | None:
    """None when symmetric-memory DDA can run here, else one line saying why not."""
    if not torch.cuda.is_available():
        return "no CUDA/ROCm device (DDA on GPUs needs torch symmetric memory)"
    try:
        importlib.import_module("torch.distributed._symmetric_memory")
    except ImportError as e:
        return f"torch {torch.__version__} has no symmetric memory: {e}"
    if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce_out"):
        return f"torch {torch.__version__} lacks symm_mem one-shot allreduce"
    return None


class SymmMemDDAComm(TorchComm):
    backend = "dda"

    def __init__(self, axis: str, group: dist.ProcessGroup | None = None, ranks: list[int] | None = None, *,
                 max_bytes: int = 64 << 20, twoshot_min_bytes: int = 256 << 10, **_ignored):
        why = symm_mem_unavailable_reason()
        if why:
            raise RuntimeError(why)
        symm_mem = importlib.import_module("torch.distributed._symmetric_memory")
        super().__init__(axis, group, ranks)
        self.backend = "dda"
        self.twoshot_min_bytes = twoshot_min_bytes
        self.group_name = (group or dist.group.WORLD).group_name
        self.buffer = symm_mem.empty(max_bytes, dtype=torch.uint8, device=torch.device("cuda", torch.cuda.current_device()))
        symm_mem.rendezvous(self.buffer, self.group_name)

    def all_reduce(self, x: Tensor) -> Tensor:
        nbytes = x.numel() * x.element_size()
        if self.world_size == 1 or nbytes == 0:
            return x
        if nbytes > self.buffer.numel() or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return super().all_reduce(x)
        with comm_span(self.axis, "all_reduce", x, self.world_size, "dda"):
            buf = self.buffer[:nbytes].view(x.dtype).view(x.shape)
            buf.copy_(x)
            if nbytes >= self.twoshot_min_bytes:
                torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", self.group_name)
                x.copy_(buf)
            else:
                torch.ops.symm_mem.one_shot_all_reduce_out(buf, "sum", self.group_name, x)
        return x
