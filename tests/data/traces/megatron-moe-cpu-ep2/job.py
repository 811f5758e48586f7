"""Megatron-Core's MoE all-to-all token dispatcher (MoEAlltoAllTokenDispatcher), expert parallel over
2 CPU ranks (gloo), profiled with record_shapes. A router that sends most tokens to expert 3."""
import os
import sys
import warnings

warnings.filterwarnings("ignore")
import torch
import torch.distributed as dist

torch.set_num_threads(1)


class _HostStream:
    """CPU stand-in for the dispatcher's device-to-host copy stream: on CPU the split counts are already
    on the host, so its waits and events have nothing to do. Only this helper is replaced; the
    dispatch and combine (and their all-to-all with split sizes) are Megatron-Core's own code."""

    def wait_stream(self, s):
        pass

    def record_event(self):
        return self

    def synchronize(self):
        pass


import contextlib  # noqa: E402

_host = _HostStream()
torch.cuda.Stream = lambda *a, **k: _host
torch.cuda.current_stream = lambda *a, **k: _host
torch.cuda.stream = lambda s: contextlib.nullcontext()
torch.cuda.current_device = lambda: torch.device("cpu")  # where Megatron allocates its buffers: the host here
dist.init_process_group("gloo")
rank = dist.get_rank()
from megatron.core import parallel_state
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.moe import token_dispatcher  # noqa: E402
from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher  # noqa: E402

_to_host = token_dispatcher.maybe_move_tensor_to_cpu


def _host_splits(tensor, as_numpy=False, record_stream=False):
    """On a GPU the split counts come back to the host as numpy arrays; a CPU tensor is left as it is
    by Megatron's helper, which all_to_all_single's split lists do not accept: make it the same."""
    out = _to_host(tensor, as_numpy=as_numpy, record_stream=record_stream)
    return out.numpy() if as_numpy and torch.is_tensor(out) else out


token_dispatcher.maybe_move_tensor_to_cpu = _host_splits

parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, expert_model_parallel_size=2)
experts, dim, tokens = 4, 64, 32
cfg = TransformerConfig(num_layers=1, hidden_size=dim, num_attention_heads=4, num_moe_experts=experts, moe_router_topk=1, moe_router_pre_softmax=True,
                        moe_token_dispatcher_type="alltoall", expert_model_parallel_size=2, use_cpu_initialization=True)
local = [rank * 2, rank * 2 + 1]
from megatron.core.process_groups_config import ProcessGroupCollection
d = MoEAlltoAllTokenDispatcher(num_local_experts=2, local_expert_indices=local, config=cfg,
                               pg_collection=ProcessGroupCollection.use_mpu_process_groups())
g = torch.Generator().manual_seed(rank)
def step():
    x = torch.randn(tokens, dim, generator=g)
    choice = torch.where(torch.rand(tokens, generator=g) < 0.7, 3, torch.randint(0, experts, (tokens,), generator=g))
    routing = torch.nn.functional.one_hot(choice, experts).bool()
    probs = routing.float()
    h, p = d.dispatch_preprocess(x, routing, probs)
    h, p = d.token_dispatch(h, p)
    h, tpe, p = d.dispatch_postprocess(h, p)
    h = d.combine_preprocess(h)
    h = d.token_combine(h)
    return d.combine_postprocess(h)
step()
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    for _ in range(4):
        step()
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
prof.export_chrome_trace(os.path.join(out, f"rank{rank}.trace.json"))
dist.barrier()
