"""`commprobe plan` and `commprobe plan calibrate`: the what-if cost model from the command line."""

from __future__ import annotations

import typer

from commprobe.common import jsonout

from .console import console, fail, say

plan_app = typer.Typer(help="What-if planning with a calibrated cost model (no GPU needed).")


@plan_app.callback(invoke_without_command=True)
def plan(
    ctx: typer.Context,
    model: str = typer.Option("llama3-70b", help="Model preset (llama3-8b, llama3-70b, llama3-405b, small, moe-small, ...)."),
    hardware: str = typer.Option("h100x8", help="Hardware profile name (plan/hardware/*.toml) or a .toml path."),
    tp: int = typer.Option(8, help="Tensor-parallel degree."),
    cp: int = typer.Option(1, help="Context-parallel degree."),
    ep: int = typer.Option(1, help="Expert-parallel degree."),
    batch: int = typer.Option(1, help="Sequences per batch."),
    prompt_len: int = typer.Option(2048, help="New prompt tokens to prefill."),
    cached_len: int = typer.Option(0, help="Tokens already in the KV cache (multi-turn prefill)."),
    allreduce: str = typer.Option("ring", help="TP allreduce algorithm: ring (NCCL/RCCL), dda, dda-oneshot, dda-twoshot."),
    cp_variant: str = typer.Option("auto", help="CP prefill: auto, pass-kv, pass-q."),
    overlap_all_to_all: bool = typer.Option(False, help="EP dispatch/combine hidden behind expert compute."),
    expert_imbalance: float = typer.Option(1.0, help="Rows the busiest EP rank's experts get over the mean (router skew)."),
    routing_from: str | None = typer.Option(None, help="A profiled MoE bundle (any layout): take --expert-imbalance for this EP degree from its routed-token counts."),
    what_if: str | None = typer.Option(None, help="Alternatives, e.g. 'allreduce=dda|x0.5, all_to_all=overlap, tp=4,8,16'."),
    sort: str = typer.Option("ttit", help="Sort the what-if table by ttit or ttft."),
    json_out: bool = typer.Option(False, "--json", help="Print the prediction(s) as JSON."),
    from_trace: str | None = typer.Option(None, "--from", help="A bundle or trace(s): predict *its* phases under "
                                          "--what-if backend=B or OP=B (e.g. allreduce=dda), from its own calls and "
                                          "--calibration; or tp=N (cp=N, ep=N) for a commprobe bundle, with a sweep."),
    calibration: str | None = typer.Option(None, help="With --from: the machine's collectives measured (a sweep's "
                                           "JSON, or a `profile --backend gloo,dda` bundle; several joined by commas)."),
) -> None:
    """Predict TTFT, TTIT, tokens/s and exposed communication for a layout on given hardware."""
    if ctx.invoked_subcommand is not None:
        return
    if from_trace:
        from commprobe.common.errors import InputError
        from commprobe.plan.fromtrace import predict_from
        from commprobe.reports.terminal import render_layout_whatif, render_trace_whatif

        if not what_if or not calibration:
            fail("plan --from needs --what-if backend=B (or OP=B, or tp=N) and --calibration")
        try:
            kind, doc = predict_from(from_trace, what_if, calibration)
        except (InputError, ValueError, OSError) as e:
            fail(str(e))
        render = render_layout_whatif if kind == "layout" else render_trace_whatif
        if json_out:
            print(jsonout.dumps(doc))
        else:
            render(doc, console)
        return

    from commprobe.plan.request import PlanRequest, plan_doc
    from commprobe.reports.plan import render_prediction, render_whatif

    try:
        req = PlanRequest(model=model, hardware=hardware, tp=tp, cp=cp, ep=ep, batch=batch, prompt_len=prompt_len,
                          cached_len=cached_len, allreduce=allreduce, cp_variant=cp_variant,
                          overlap_all_to_all=overlap_all_to_all, expert_imbalance=expert_imbalance,
                          routing_from=routing_from, what_if=what_if, sort=sort)
        hw, base, rows, skipped = req.run()
    except ValueError as e:
        fail(str(e))
    if json_out:
        print(jsonout.dumps(plan_doc(hw, model, base, rows, skipped)))
        return
    render_prediction(base, f"{model} on {hw.name}: TP{tp} CP{cp} EP{ep}, batch {batch}, prompt {prompt_len}", console)
    if what_if:
        render_whatif(rows, skipped, sort, console)


@plan_app.command("collectives")
def plan_collectives(
    hardware: str = typer.Option("h100x8", help="Hardware profile name (plan/hardware/*.toml) or a .toml path."),
    worlds: str = typer.Option("2,4,8", help="Group sizes, comma-separated."),
) -> None:
    """A hardware profile's collective times as a calibration (JSON rows of a `bench collectives` sweep):
    `analyze --calibration FILE` then gives any trace's headroom against it."""
    from commprobe.plan.costmodel import collective_rows
    from commprobe.plan.hardware import PlanError, load_hardware

    try:
        hw = load_hardware(hardware)
        ns = tuple(int(x) for x in worlds.split(",") if x.strip())
    except (PlanError, ValueError) as e:
        fail(str(e) if isinstance(e, PlanError) else f"--worlds {worlds!r}: comma-separated integers")
    print(jsonout.dumps(collective_rows(hw, ns)))


@plan_app.command("calibrate")
def plan_calibrate(
    inputs: list[str] = typer.Argument(..., help="Sweep JSON files (bench collectives --json) and profile bundles."),
    output: str = typer.Option("this-machine.toml", "-o", "--output", help="Hardware profile to write."),
    name: str = typer.Option("this-machine", help="Profile name."),
) -> None:
    """Fit this machine's links (alpha, bandwidth) and compute rates from measured sweeps and profiles."""
    from pathlib import Path

    from commprobe.plan.calibrate import calibrate
    from commprobe.plan.hardware import to_toml

    try:
        hw, runs = calibrate(inputs, name)
    except (KeyError, OSError) as e:
        fail(str(e) if not isinstance(e, KeyError) else f"a bundle lacks {e} (is it a commprobe bundle?)")
    Path(output).write_text(to_toml(hw))
    say(f"{output}: {hw.peak_tflops * 1e3:.2f} GFLOP/s, {hw.mem_bw_GBps:.2f} GB/s, {hw.layer_overhead_us:.0f} µs per "
        "layer; links " + ", ".join(f"{k} {v.alpha_us:.1f} µs + {v.bw_GBps:.2f} GB/s" for k, v in hw.links.items()
                                    if k not in ("intra", "inter")))
