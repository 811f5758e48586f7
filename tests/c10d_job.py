"""One rank of a two-rank gloo job that calls every c10d collective API under torch.profiler, each
inside a `record_function("api:NAME")`, and writes its Kineto trace: what the installed torch
really records for each API (tests/test_c10d_names.py).

    python tests/c10d_job.py RANK OUT_DIR
"""

from __future__ import annotations

import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

# API name -> (call, the op the analysis must give it)
EXPECTED = {
    "all_reduce": "allreduce", "all_gather": "all_gather", "all_gather_into_tensor": "all_gather",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter", "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all", "all_to_all_single_splits": "all_to_all", "broadcast": "broadcast",
    "reduce": "reduce", "gather": "gather", "scatter": "scatter", "send_recv": "send_recv",
    "batch_isend_irecv": "send_recv", "barrier": "barrier", "all_reduce_coalesced": "allreduce",
}


def calls(rank: int, world: int) -> dict:
    x, peer = torch.ones(8), 1 - rank

    def send_recv():
        if rank == 0:
            dist.send(x, peer)
            dist.recv(torch.empty(8), peer)
        else:
            dist.recv(torch.empty(8), peer)
            dist.send(x, peer)

    return {
        "all_reduce": lambda: dist.all_reduce(x),
        "all_gather": lambda: dist.all_gather([torch.empty(8) for _ in range(world)], x),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.empty(8 * world), x),
        "reduce_scatter": lambda: dist.reduce_scatter(torch.empty(4), [torch.ones(4) for _ in range(world)]),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4 * world)),
        "all_to_all": lambda: dist.all_to_all([torch.empty(4) for _ in range(world)], [torch.ones(4) for _ in range(world)]),
        "all_to_all_single": lambda: dist.all_to_all_single(torch.empty(8), x),
        # uneven splits: rank r sends 2 + r rows to each peer (MoE dispatch's shape)
        "all_to_all_single_splits": lambda: dist.all_to_all_single(
            torch.empty(sum(2 + s for s in range(world))), torch.ones((2 + rank) * world),
            [2 + s for s in range(world)], [2 + rank] * world),
        "broadcast": lambda: dist.broadcast(x, src=0),
        "reduce": lambda: dist.reduce(x, dst=0),
        "gather": lambda: dist.gather(x, [torch.empty(8) for _ in range(world)] if rank == 0 else None, dst=0),
        "scatter": lambda: dist.scatter(torch.empty(8), [torch.ones(8) for _ in range(world)] if rank == 0 else None, src=0),
        "send_recv": send_recv,
        "batch_isend_irecv": lambda: [r.wait() for r in dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, torch.empty(8), peer)])],
        "barrier": lambda: dist.barrier(),
        "all_reduce_coalesced": lambda: dist.all_reduce_coalesced([torch.ones(4), torch.ones(4)]),
    }


def main() -> None:
    rank, out = int(sys.argv[1]), sys.argv[2]
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=2)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for name, fn in calls(rank, 2).items():
            with record_function(f"api:{name}"):
                fn()
    prof.export_chrome_trace(f"{out}/rank{rank}.pt.trace.json")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
