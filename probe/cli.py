"""The `commprobe` command line. Thin: it checks arguments, calls the library, prints.

Bad input is one line on stderr and exit status 2; a failed rank is one line and status 1.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Profile and diagnose communication bottlenecks in distributed LLM inference.",
)
out = Console()
err = Console(stderr=True)


@app.callback()
def _root() -> None:
    """Profile and diagnose communication bottlenecks in distributed LLM inference."""


def fail(msg: str, code: int = 2) -> NoReturn:
    err.print(f"commprobe: error: {msg}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@app.command()
def profile(
    preset: str = typer.Option("small", help="Model preset: tiny, small, llama3-8b, ..."),
    tp: int = typer.Option(2, help="Tensor-parallel degree (ranks)."),
    steps: int = typer.Option(32, "--steps", "--decode-steps", help="Decode steps per repetition."),
    prompt_len: int = typer.Option(128, help="Prompt length (tokens) for prefill."),
    batch: int = typer.Option(1, help="Sequences per batch."),
    repeats: int = typer.Option(3, help="Measured repetitions of prefill + decode (after one warm-up)."),
    seed: int = typer.Option(0, help="Seed of the random weights and prompt."),
    checkpoint: Optional[str] = typer.Option(None, help="HF-format directory (config.json + safetensors)."),
    backend: str = typer.Option("auto", help="Collective backend: auto, gloo, nccl, rccl, dda."),
    timeout: float = typer.Option(300.0, help="Seconds before a rank that has not finished is called hung."),
    oversubscribe: bool = typer.Option(False, help="Allow more ranks than CPU cores."),
) -> None:
    """Run prefill + decode on TP ranks and print TTFT, TTIT (median, p90) and tokens/s per rank."""
    from collectives.backends import BACKENDS, process_group_backend
    from probe.launch import LaunchError, launch, run_this_rank, under_torchrun
    from probe.run import RunConfig, run_rank
    from reference_impl.config import get_preset
    from reference_impl.tp import check_tp

    for name, v in (("--steps", steps), ("--prompt-len", prompt_len), ("--batch", batch), ("--repeats", repeats)):
        if v < 1:
            fail(f"{name} must be >= 1, got {v}")
    try:
        if checkpoint:
            from reference_impl.checkpoint import config_from_hf
            from pathlib import Path

            mcfg = config_from_hf(Path(checkpoint))
        else:
            mcfg = get_preset(preset)
        check_tp(mcfg, tp)
    except ValueError as e:
        fail(str(e))
    if prompt_len + steps > mcfg.max_seq_len:
        fail(f"--prompt-len + --steps = {prompt_len + steps} exceeds the model's max_seq_len {mcfg.max_seq_len}")
    if backend not in BACKENDS:
        fail(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
    if backend == "auto":
        backend = process_group_backend("auto")
    pg_backend = process_group_backend(backend)
    cfg = RunConfig(preset=preset, tp=tp, batch=batch, prompt_len=prompt_len, decode_steps=steps, repeats=repeats,
                    seed=seed, checkpoint=checkpoint, backend=backend, timeout=timeout)

    if under_torchrun():
        results = [run_this_rank(run_rank, (cfg,), backend=pg_backend, timeout=timeout)]
    else:
        cores = os.cpu_count() or 1
        if cfg.world_size > cores and not oversubscribe:
            fail(f"world size {cfg.world_size} exceeds the {cores} CPU cores here; pass --oversubscribe to run anyway")
        out.print(f"[bold]commprobe profile[/]: preset {mcfg.name}, TP={tp}, backend {backend}, "
                  f"batch {batch}, prompt {prompt_len}, {steps} decode steps x {repeats} repeats", highlight=False)
        try:
            results = launch(run_rank, cfg.world_size, (cfg,), backend=pg_backend, timeout=timeout)
        except LaunchError as e:
            fail(str(e), code=1)

    table = Table(title="Latency per rank (un-profiled)")
    for col in ("rank", "TTFT ms", "TTIT median ms", "TTIT p90 ms", "tokens/s", "weights MB"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(str(r.rank), f"{r.ttft_median_ms:.1f}", f"{r.ttit_median_ms:.2f}", f"{r.ttit_p90_ms:.2f}",
                      f"{r.tokens_per_s:.1f}", f"{r.local_param_bytes / 1e6:.0f}")
    out.print(table)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("commprobe: interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
