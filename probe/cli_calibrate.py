"""`commprobe calibrate`: K alternated rounds of one job under each backend, one calibration that
`plan --from`, `analyze --calibration` and `report --calibration` read (probe/calibrate.py)."""

from __future__ import annotations

import os

import typer

from .console import check_cores, console, fail


def calibrate(
    preset: str = typer.Option("tiny", help="Model preset: tiny, small, llama3-8b, ..."),
    tp: int = typer.Option(2, help="Tensor-parallel degree (ranks)."),
    cp: int = typer.Option(1, help="Context-parallel degree (ranks)."),
    ep: int = typer.Option(1, help="Expert-parallel degree (needs an MoE preset)."),
    cp_variant: str = typer.Option("auto", help="Ring attention: auto, pass-kv, pass-q."),
    device: str = typer.Option("auto", help="Where the model runs: auto, cpu, cuda."),
    steps: int = typer.Option(16, "--steps", "--decode-steps", help="Decode steps per repetition."),
    prompt_len: int = typer.Option(16, help="Prompt length (tokens) for prefill."),
    batch: int = typer.Option(1, help="Sequences per batch."),
    repeats: int = typer.Option(10, help="Un-profiled repetitions per run (each one TTFT sample)."),
    profiled_repeats: int = typer.Option(6, help="Profiled repetitions per run."),
    seed: int = typer.Option(0, help="Seed of the random weights and prompt."),
    like: str | None = typer.Option(None, "--like", help="A bundle of the job to calibrate for: its model, layout, "
                                    "batch, prompt and steps replace the options above (--repeats and "
                                    "--profiled-repeats still apply)."),
    backend: str = typer.Option("gloo,dda", help="The backends to predict between, comma-separated (two or more)."),
    rounds: int = typer.Option(0, help="Rounds (each a launch of every backend, order alternated); 0: the "
                               "default chosen by measurement (bench/RESULTS.md)."),
    telemetry_interval: float = typer.Option(0.05, help="Seconds between telemetry samples (profile's default: "
                                             "the rounds run as `profile` runs the job)."),
    max_minutes: float = typer.Option(30.0, help="Start no round that would end past this bound."),
    out_dir: str | None = typer.Option(None, "--out", help="Calibration directory (default runs/calibration-TIMESTAMP)."),
    timeout: float = typer.Option(300.0, help="Seconds before a rank that has not finished is called hung."),
    oversubscribe: bool = typer.Option(False, help="Allow more ranks than CPU cores."),
) -> None:
    """Measure the calibration a what-if needs: the same job, K rounds alternating the backends."""
    import time
    from pathlib import Path

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from commprobe.analyzers.calibration import CALIBRATION_FILE
    from commprobe.collectives.backends import process_group_backend
    from commprobe.probe.calibrate import DEFAULT_ROUNDS, Calibration, job_like, run_calibration
    from commprobe.probe.launch import LaunchError
    from commprobe.probe.profile import run_profile
    from commprobe.reports.terminal import render_calibration

    out = Path(out_dir or f"runs/calibration-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        fail(f"--out {out} exists and is not an empty directory; choose another")
    job = {"preset": preset, "tp": tp, "cp": cp, "ep": ep, "cp_variant": cp_variant, "device": device, "batch": batch,
           "prompt_len": prompt_len, "decode_steps": steps, "repeats": repeats, "profiled_repeats": profiled_repeats,
           "seed": seed, "timeout": timeout}
    if telemetry_interval <= 0:
        fail("--telemetry-interval must be > 0")
    if like:
        job = {**job, **job_like(like)}  # a bundle that is not one: InputError, one line (cli.main)
    try:
        cal = Calibration(job=job, backends=[b for b in backend.split(",") if b], rounds=rounds or DEFAULT_ROUNDS,
                          max_seconds=max_minutes * 60)
    except ValueError as e:
        fail(str(e))
    check_cores(job["tp"] * job["cp"] * job["ep"], oversubscribe)
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    console.print(f"[bold]commprobe calibrate[/]: preset {job['preset']}, TP{job['tp']} CP{job['cp']} EP{job['ep']}, "
                  f"prompt {job['prompt_len']}, {job['decode_steps']} steps x {repeats}, {', '.join(cal.backends)} "
                  f"alternated, {cal.rounds} rounds (bound {max_minutes:g} min) -> {out}", highlight=False)

    def run_round(cfg) -> None:
        run_profile(cfg, cfg.model_config().to_dict(), pg_backend=process_group_backend(cfg.backends),
                    telemetry_interval=telemetry_interval)

    cols = (TextColumn("rounds"), BarColumn(), MofNCompleteColumn(), TextColumn("elapsed"), TimeElapsedColumn(),
            TextColumn("left"), TimeRemainingColumn())
    try:
        with Progress(*cols, console=console.real(), transient=False) as bar:
            task = bar.add_task("rounds", total=cal.rounds)
            doc = run_calibration(cal, out, run_round, on_progress=lambda p: bar.update(task, completed=p.done),
                                  on_status=lambda s: bar.console.print(s, highlight=False))
    except LaunchError as e:
        fail(f"{e} (the rounds done are kept in {out / CALIBRATION_FILE})", code=1)
    except OSError as e:
        fail(f"cannot write the calibration in {out}: {e.strerror or e}", code=1)
    render_calibration(doc, str(out), console)
