"""One rank of a two-rank gloo job under torch.profiler, in one of two shapes (tests/test_seqpar.py):

    ulysses  all-to-all (sequence -> heads), scaled_dot_product_attention, all-to-all back: the
             exchange of DeepSpeed-Ulysses-style sequence-parallel attention (CP)
    moe      all-to-all dispatch, the experts' matmul (in a record_function "moe_experts"),
             all-to-all combine: expert parallelism (EP)

    python tests/seqpar_job.py RANK OUT_DIR MODE
"""

from __future__ import annotations

import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function


def main() -> None:
    rank, out, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=2)
    x = torch.randn(2, 64, 16)  # (heads, tokens, head_dim) on this rank
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            y = torch.empty_like(x)
            dist.all_to_all_single(y, x)
            if mode == "ulysses":
                z = F.scaled_dot_product_attention(y, y, y)
            else:
                with record_function("moe_experts"):
                    z = y @ torch.randn(16, 16)
            back = torch.empty_like(z)
            dist.all_to_all_single(back, z.contiguous())
            x = back
    prof.export_chrome_trace(f"{out}/rank{rank}.pt.trace.json")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
