"""`commprobe bench collectives` and `commprobe bench time-sharing`: launch a benchmark's ranks,
print its table (reports/terminal.py) or its JSON rows."""

from __future__ import annotations

import typer

from commprobe.common import jsonout

from .console import check_cores, console, err, fail, say

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: collective sweeps.")


@bench_app.command("collectives")
def bench_collectives(
    backend: str = typer.Option("gloo,dda", help="Comma-separated: gloo, dda, deepspeed, nccl."),
    op: str = typer.Option("allreduce", help="Comma-separated: allreduce, all_to_all."),
    min_size: str = typer.Option("4K", "--min", help="Smallest message (bytes; K/M/G suffixes)."),
    max_size: str = typer.Option("64M", "--max", help="Largest message."),
    factor: int = typer.Option(4, help="Size multiplier between steps."),
    world: int = typer.Option(2, help="Ranks."),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16."),
    batches: int = typer.Option(5, help="Timed batches per size and backend (median reported)."),
    json_out: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
    timeout: float = typer.Option(1800.0, help="Seconds before the sweep is called hung."),
    oversubscribe: bool = typer.Option(False, help="Allow more ranks than CPU cores."),
) -> None:
    """nccl-tests-style sweep: time per call, algbw and busbw per size, backends interleaved."""
    import tempfile
    from pathlib import Path

    from rich.progress import Progress

    from commprobe.common.units import parse_size
    from commprobe.probe.bench import run_sweep
    from commprobe.probe.bench.sweep import SweepConfig
    from commprobe.probe.launch import LaunchError
    from commprobe.reports.terminal import render_sweep

    work = Path(tempfile.mkdtemp(prefix="commprobe-bench-"))
    ops = [o for o in op.split(",") if o]
    try:
        cfg = SweepConfig(backends=backend.split(","), ops=ops, min_bytes=parse_size(min_size),
                          max_bytes=parse_size(max_size), factor=factor, dtype=dtype, batches=batches,
                          progress_file=str(work / "progress"))
    except ValueError as e:
        fail(str(e))
    if world < 2:
        fail("--world must be >= 2")
    check_cores(world, oversubscribe)
    with Progress(console=(err if json_out else console).real(), transient=True) as bar:
        task = bar.add_task("sweeping", total=len(cfg.sizes()) * len(ops))

        def poll() -> None:
            try:
                done, total = map(int, (work / "progress").read_text().split())
                bar.update(task, completed=done, total=total)
            except (OSError, ValueError):
                pass

        try:
            res = run_sweep(cfg, world, timeout=timeout, workdir=work / "ranks", on_poll=poll)
        except LaunchError as e:
            fail(str(e), code=1)
    for b, why in res["skipped"].items():
        say(f"commprobe: backend {b} skipped: {why}", to_err=True)
    if json_out:
        print(jsonout.dumps(res["rows"]))
    else:
        render_sweep(res, ops, world, dtype, batches, console)


@bench_app.command("time-sharing")
def bench_time_sharing(
    world: int = typer.Option(4, help="Ranks: more than the usable cores."),
    work: str = typer.Option("256K,1M,4M,16M,64M", help="Comma-separated weight bytes each rank streams "
                             "(a matrix-vector product) before every call."),
    backend: str = typer.Option("dda", help="dda or gloo: the collective after each piece of work."),
    size: str = typer.Option("4K", help="Allreduce message (bytes; K/M suffixes)."),
    rounds: int = typer.Option(7, help="Alternated rounds (one rank per core, then all ranks); medians."),
    json_out: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
    timeout: float = typer.Option(1800.0, help="Seconds before the benchmark is called hung."),
) -> None:
    """What ranks beyond the cores cost per collective call, beyond ranks/cores (for `plan calibrate`)."""
    import tempfile
    from pathlib import Path

    from commprobe.common.host import usable_cores
    from commprobe.common.units import parse_size
    from commprobe.probe.bench import run_time_sharing
    from commprobe.probe.bench.timeshare import TimeShareConfig
    from commprobe.probe.launch import LaunchError
    from commprobe.reports.terminal import render_time_sharing

    workdir = Path(tempfile.mkdtemp(prefix="commprobe-bench-"))
    try:
        cfg = TimeShareConfig(work_bytes=[parse_size(w) for w in work.split(",") if w.strip()],
                              message_bytes=parse_size(size), backend=backend, cores=usable_cores(), rounds=rounds,
                              progress_file=str(workdir / "progress"))
        cfg.check_world(world)
    except ValueError as e:
        fail(str(e))
    try:
        rows = run_time_sharing(cfg, world, timeout=timeout, workdir=workdir / "ranks")
    except LaunchError as e:
        fail(str(e), code=1)
    if json_out:
        print(jsonout.dumps(rows))
    else:
        render_time_sharing(rows, world, cfg.cores, backend, size, rounds, console)
