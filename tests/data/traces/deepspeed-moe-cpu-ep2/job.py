"""DeepSpeed-MoE layer, expert parallel over 2 CPU ranks (gloo), profiled with record_shapes."""
import os, sys
import torch
import torch.distributed as dist
import deepspeed
from deepspeed.moe.layer import MoE

torch.set_num_threads(1)
deepspeed.init_distributed(dist_backend="gloo")
rank = dist.get_rank()
torch.manual_seed(0)
dim, experts = 64, 4
expert = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))
moe = MoE(hidden_size=dim, expert=expert, num_experts=experts, ep_size=2, k=1, capacity_factor=1.0,
          eval_capacity_factor=float(os.environ.get("CF", "1.0")), min_capacity=4, drop_tokens=os.environ.get("DROP", "1") == "1",
          use_rts=False)
moe.set_deepspeed_parallelism()
with torch.no_grad():  # a gate that sends most tokens to expert 3 (on EP rank 1)
    moe.deepspeed_moe.gate.wg.weight.zero_()
    moe.deepspeed_moe.gate.wg.weight[3, :] = 1.0
moe.eval()
x = torch.ones(1, 32, dim) + 0.01 * torch.randn(1, 32, dim)
x[:, :8] = -x[:, :8]  # a quarter of the tokens elsewhere
from torch.profiler import profile, ProfilerActivity
with torch.no_grad():
    moe(x)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(4):
            moe(x)
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
prof.export_chrome_trace(os.path.join(out, f"rank{rank}.trace.json"))
dist.barrier()
