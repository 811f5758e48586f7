"""Apply the parallel plans a job's groups call for: TP, then EP, then CP around the model."""

from __future__ import annotations

from commprobe.collectives.comm import Comm

from .cp import ContextParallel
from .ep import apply_ep
from .model import Transformer
from .tp import apply_tp


def parallelize(model: Transformer, comms: dict[str, Comm], cp_variant: str = "auto"):
    """Shard `model` for this rank's groups ({axis: Comm}, absent axes are size 1).

    Returns an object with `setup_cache`, `prefill` and `decode_step`: the model itself, or a
    `ContextParallel` wrapper when there is a CP group.
    """
    if "tp" in comms:
        apply_tp(model, comms["tp"])
    if "ep" in comms:
        apply_ep(model, comms["ep"])
    if "cp" in comms:
        return ContextParallel(model, comms["cp"], cp_variant)
    return model


def bind_comms(runner, comms: dict[str, Comm]):
    """Point an already sharded runner at other Comms of the same layout (switching backends
    between interleaved repetitions needs no re-sharding)."""
    from .ep import EPDispatch
    from .moe import MoE
    from .tp import bind_tp_comm

    model = runner.model if isinstance(runner, ContextParallel) else runner
    if "tp" in comms:
        bind_tp_comm(model, comms["tp"])
    if "ep" in comms:
        dispatch = EPDispatch(comms["ep"])
        for block in model.layers:
            if isinstance(block.feed_forward, MoE):
                block.feed_forward.dispatch = dispatch
    if "cp" in comms:
        runner.comm = comms["cp"]
    return runner
