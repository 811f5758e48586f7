"""The `commprobe` command line. Thin: it checks arguments, calls the library, prints.

Bad input is one line on stderr and exit status 2; a failed rank is one line and status 1.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Profile and diagnose communication bottlenecks in distributed LLM inference.",
)
console = Console(width=None if sys.stdout.isatty() else 120)
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
    cp: int = typer.Option(1, help="Context-parallel degree: the prompt sharded over a ring (ranks)."),
    ep: int = typer.Option(1, help="Expert-parallel degree (needs an MoE preset: moe-tiny, moe-small)."),
    cp_variant: str = typer.Option("auto", help="Ring attention: auto, pass-kv, pass-q."),
    device: str = typer.Option("auto", help="Where the model runs: auto (a GPU per rank when present), cpu, cuda."),
    steps: int = typer.Option(32, "--steps", "--decode-steps", help="Decode steps per repetition."),
    prompt_len: int = typer.Option(128, help="Prompt length (tokens) for prefill."),
    batch: int = typer.Option(1, help="Sequences per batch."),
    repeats: int = typer.Option(3, help="Un-profiled repetitions of prefill + decode (after one warm-up)."),
    seed: int = typer.Option(0, help="Seed of the random weights and prompt."),
    checkpoint: str | None = typer.Option(None, help="HF-format directory (config.json + safetensors)."),
    backend: str = typer.Option("auto", help="Collective backend(s), comma-separated: auto, gloo, nccl, rccl, dda."),
    out_dir: str | None = typer.Option(None, "--out", help="Bundle directory (default runs/profile-TIMESTAMP)."),
    telemetry_interval: float = typer.Option(0.05, help="Seconds between telemetry samples."),
    timeout: float = typer.Option(300.0, help="Seconds before a rank that has not finished is called hung."),
    oversubscribe: bool = typer.Option(False, help="Allow more ranks than CPU cores."),
) -> None:
    """Profile prefill + decode on TP x CP x EP ranks; write a run bundle; print TTFT, TTIT and tokens/s per rank."""
    import time
    from pathlib import Path

    from collectives.backends import BACKENDS, process_group_backend
    from collectives.mesh import Mesh
    from probe.launch import LaunchError, under_torchrun
    from probe.profile import run_profile, run_profile_torchrun
    from probe.run import RunConfig
    from reference_impl.config import get_preset
    from reference_impl.cp import check_cp
    from reference_impl.ep import check_ep
    from reference_impl.tp import check_tp

    for name, v in (("--steps", steps), ("--prompt-len", prompt_len), ("--batch", batch), ("--repeats", repeats)):
        if v < 1:
            fail(f"{name} must be >= 1, got {v}")
    if telemetry_interval <= 0:
        fail("--telemetry-interval must be > 0")
    if device not in ("auto", "cpu", "cuda"):
        fail(f"--device must be auto, cpu or cuda, got {device!r}")
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda, but torch sees no CUDA/ROCm device (a CPU build of torch, or no driver)")
    try:
        if checkpoint:
            from reference_impl.checkpoint import config_from_hf

            mcfg = config_from_hf(Path(checkpoint))
        else:
            mcfg = get_preset(preset)
        check_tp(mcfg, tp)
        check_cp(cp, cp_variant)
        check_ep(mcfg, ep)
        mesh = Mesh(tp=tp, cp=cp, ep=ep)
    except ValueError as e:
        fail(str(e))
    if prompt_len + steps > mcfg.max_seq_len:
        fail(f"--prompt-len + --steps = {prompt_len + steps} exceeds the model's max_seq_len {mcfg.max_seq_len}")
    backends = [b for b in backend.split(",") if b]
    for b in backends:
        if b not in BACKENDS:
            fail(f"unknown backend {b!r} (known: {', '.join(BACKENDS)})")
    backends = [process_group_backend("auto") if b == "auto" else b for b in backends]
    if len(set(backends)) != len(backends) or not backends:
        fail("--backend lists a backend twice, or none")
    pg_backend = process_group_backend(backends[0])
    out = Path(out_dir or f"runs/profile-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and not out.is_dir():
        fail(f"--out {out} exists and is not a directory")
    first = not under_torchrun() or int(os.environ.get("RANK", 0)) == 0  # other ranks would see rank 0's
    if first and out.is_dir() and (out / "manifest.json").exists():
        fail(f"--out {out} already holds a bundle; choose another directory")
    cfg = RunConfig(preset=preset, tp=tp, cp=cp, ep=ep, cp_variant=cp_variant, device=device, batch=batch, prompt_len=prompt_len, decode_steps=steps, repeats=repeats,
                    seed=seed, checkpoint=checkpoint, backends=backends, timeout=timeout, out_dir=str(out))
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # keep Kineto's start/stop chatter off the terminal

    if under_torchrun():
        results = run_profile_torchrun(cfg, mcfg.to_dict(), pg_backend=pg_backend,
                                       telemetry_interval=telemetry_interval)
        if int(os.environ.get("RANK", 0)) != 0:
            return  # rank 0 prints the run's table
    else:
        from collectives.dda import usable_cores

        cores = usable_cores()
        if cfg.world_size > cores and not oversubscribe:
            fail(f"world size {cfg.world_size} exceeds the {cores} CPU cores here; pass --oversubscribe to run anyway")
        console.print(f"[bold]commprobe profile[/]: preset {mcfg.name}, backend {','.join(backends)}, "
                      f"batch {batch}, prompt {prompt_len}, {steps} decode steps x {repeats} repeats", highlight=False)
        console.print(mesh.describe(), highlight=False, markup=False)
        try:
            outcome = run_profile(cfg, mcfg.to_dict(), pg_backend=pg_backend, telemetry_interval=telemetry_interval,
                                  on_status=lambda line: console.print(line, highlight=False, markup=False))
        except LaunchError as e:
            fail(f"{e} (partial bundle kept in {out})", code=1)
        except OSError as e:
            fail(f"cannot write the bundle in {out}: {e.strerror or e}", code=1)
        results = outcome.results

    axes = [a for a in ("tp", "cp", "ep") if getattr(mesh, a) > 1]
    for b in backends:
        table = Table(title=f"Latency per rank and phase, backend {b} (un-profiled; comm % = blocked in that axis's collectives)")
        cols = ["rank", "TTFT ms", "TTIT median ms", "TTIT p90 ms", "tokens/s"]
        cols += [f"prefill {a} %" for a in axes] + [f"decode {a} %" for a in axes] + ["weights MB"]
        for col in cols:
            table.add_column(col, justify="right")
        for res in results:
            r = res.timings[b]
            table.add_row(str(r.rank), f"{r.ttft_median_ms:.1f}", f"{r.ttit_median_ms:.2f}", f"{r.ttit_p90_ms:.2f}",
                          f"{r.tokens_per_s:.1f}", *[f"{100 * r.comm_share('prefill', a):.1f}" for a in axes],
                          *[f"{100 * r.comm_share('decode', a):.1f}" for a in axes],
                          f"{res.local_param_bytes / 1e6:.0f}")
        console.print(table)
    console.print(f"bundle: {out}", highlight=False, markup=False)


@app.command()
def analyze(
    path: str = typer.Argument(..., help="A run bundle, a trace file, or a directory of rank traces."),
    json_out: bool = typer.Option(False, "--json", help="Print the versioned JSON result."),
    rules: str | None = typer.Option(None, help="Classification rules file (TOML or JSON)."),
    threshold: float = typer.Option(0.2, help="Exposed-communication share above which a phase is communication-bound."),
    align: str = typer.Option("base", help="Clock alignment: base (baseTimeNanoseconds) or collective-end."),
    out_file: str | None = typer.Option(None, "--out", help="Also write the JSON result to this file."),
) -> None:
    """Attribute end-to-end latency to compute, TP allreduce, CP ring and EP all-to-all; give a verdict."""
    import json

    from analyzers.analysis import analyze as run_analysis
    from analyzers.trace import TraceError
    from reports.terminal import render_analysis

    if align not in ("base", "collective-end"):
        fail(f"unknown --align {align!r} (base, collective-end)")
    try:
        result = run_analysis(path, rules_file=rules, threshold=threshold, align=align)
    except TraceError as e:
        fail(str(e))
    if out_file:
        from pathlib import Path

        Path(out_file).write_text(json.dumps(result, indent=1))
    if json_out:
        print(json.dumps(result, indent=1))
    else:
        render_analysis(result, console)


@app.command()
def report(
    path: str = typer.Argument(..., help="A run bundle (several backends: all compared), trace(s), or an analysis JSON."),
    output: str = typer.Option("report.html", "-o", "--output", help="Where to write the HTML report."),
    json_out: bool = typer.Option(False, "--json", help="Print the analysis result as JSON instead of the summary."),
    plan_file: str | None = typer.Option(None, "--plan", help="A `commprobe plan --json` result: adds the what-if panel."),
) -> None:
    """One self-contained HTML report (plotly.js embedded) of an analysis, plus the terminal summary."""
    import json
    from pathlib import Path

    from analyzers.analysis import analyze_backends, load_result
    from analyzers.trace import TraceError
    from reports.html import render_html
    from reports.terminal import render_analysis

    plan = None
    if plan_file:
        try:
            plan = json.loads(Path(plan_file).read_text())
            if plan.get("schema") != "commprobe.plan/1":
                raise ValueError("not a commprobe.plan/1 result")
        except (OSError, ValueError, AttributeError) as e:
            fail(f"{plan_file}: not a plan result from `commprobe plan --json` ({e})")
    try:
        by_backend = analyze_backends(path)  # a bundle with several backends: report the first, chart all
        result = next(iter(by_backend.values())) if by_backend else load_result(path)
    except TraceError as e:
        fail(str(e))
    try:
        Path(output).write_text(render_html(result, by_backend, plan), encoding="utf-8")
    except OSError as e:
        fail(f"cannot write {output}: {e.strerror or e}", code=1)
    if json_out:
        print(json.dumps(result, indent=1))
        return
    render_analysis(result, console)
    console.print(f"report: {output}", highlight=False, markup=False)


def _fraction(text: str, what: str, unit: str) -> float:
    """'10%' or '0.1' -> 0.1; for shares also '5pp' -> 0.05."""
    t = text.strip().lower()
    try:
        if unit == "pp" and t.endswith("pp"):
            return float(t[:-2]) / 100
        if t.endswith("%"):
            return float(t[:-1]) / 100
        return float(t)
    except ValueError:
        fail(f"{what} must look like 10% or 0.1{' or 5pp' if unit == 'pp' else ''}, got {text!r}")


@app.command()
def gate(
    current: str = typer.Option(..., help="The run to judge: a bundle, an analysis JSON, or a baseline file."),
    baseline: str = typer.Option(..., help="Baseline file (commprobe.baseline/1); written with --update-baseline."),
    metric: list[str] = typer.Option([], help="Metric name or glob (repeatable), e.g. 'ttit_ms' or 'dda/*'. Default: all in the baseline."),
    max_regression: str = typer.Option("10%", help="Time metrics: largest tolerated slowdown of the median."),
    max_share_increase: str = typer.Option("5pp", help="Share metrics: largest tolerated rise, in percentage points."),
    alpha: float = typer.Option(0.01, help="Significance level of the one-sided Mann-Whitney U test."),
    min_samples: int = typer.Option(5, help="Fewer samples than this on either side is unusable input (exit 2)."),
    update_baseline: bool = typer.Option(False, help="Write --current's metrics and machine facts to --baseline and exit."),
    markdown: str | None = typer.Option(None, help="Write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)."),
    junit: str | None = typer.Option(None, help="Write JUnit XML here."),
    json_file: str | None = typer.Option(None, "--json", help="Write the JSON result here ('-' for stdout)."),
) -> None:
    """CI regression gate: exit 0 pass, 1 regression, 2 unusable input (fails closed)."""
    import json
    from pathlib import Path

    from analyzers.gate import Thresholds, baseline_doc, load_metrics
    from analyzers.gate import gate as run_gate
    from analyzers.trace import TraceError
    from reports.gate import render_gate, to_junit, to_markdown

    th = Thresholds(_fraction(max_regression, "--max-regression", "%"),
                    _fraction(max_share_increase, "--max-share-increase", "pp"), alpha, min_samples)
    if not 0 < th.alpha < 1 or th.min_samples < 2 or th.max_regression < 0 or th.max_share_increase < 0:
        fail("--alpha must be in (0, 1), --min-samples >= 2, thresholds >= 0")
    try:
        if update_baseline:
            metrics, context, machine = load_metrics(current)
            few = sorted(n for n, m in metrics.items() if len(m.samples) < th.min_samples)
            metrics = {n: m for n, m in metrics.items() if n not in few}
            if few:  # a baseline metric with too few samples would make every later gate unusable
                console.print(f"left out (fewer than {th.min_samples} samples): {', '.join(few)}", highlight=False,
                              markup=False)
            if not metrics:
                fail(f"{current}: no metrics with at least {th.min_samples} samples to store")
            Path(baseline).write_text(json.dumps(baseline_doc(metrics, context, machine, current), indent=1) + "\n")
            console.print(f"baseline: {len(metrics)} metrics from {current} written to {baseline}", highlight=False,
                          markup=False)
            return
        res = run_gate(baseline, current, metric, th).to_dict()
    except TraceError as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot write {baseline}: {e.strerror or e}")
    try:
        if markdown:
            with open(markdown, "a", encoding="utf-8") as f:  # append: CI step summaries accumulate
                f.write(to_markdown(res))
        if junit:
            Path(junit).write_text(to_junit(res), encoding="utf-8")
        if json_file and json_file != "-":
            Path(json_file).write_text(json.dumps(res, indent=1), encoding="utf-8")
    except OSError as e:
        err.print(f"commprobe: error: cannot write a gate report: {e.strerror or e}", markup=False, highlight=False)
        raise typer.Exit(2) from None
    if json_file == "-":
        print(json.dumps(res, indent=1))
    else:
        render_gate(res, console)
    raise typer.Exit(res["exit_code"])


@app.command()
def compare(
    a: str = typer.Argument(..., help="Baseline: bundle, trace(s) or analysis JSON."),
    b: str = typer.Argument(..., help="Candidate: bundle, trace(s) or analysis JSON."),
    json_out: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
) -> None:
    """Two analyses side by side (gloo vs dda, NCCL vs DDA, before vs after), with B/A ratios."""
    import json

    from analyzers.analysis import compare as run_compare
    from analyzers.analysis import load_result
    from analyzers.trace import TraceError
    from reports.terminal import render_compare

    try:
        result = run_compare(load_result(a), load_result(b))
    except TraceError as e:
        fail(str(e))
    if json_out:
        print(json.dumps(result, indent=1))
    else:
        render_compare(result, console)


plan_app = typer.Typer(help="What-if planning with a calibrated cost model (no GPU needed).")
app.add_typer(plan_app, name="plan")


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
) -> None:
    """Predict TTFT, TTIT, tokens/s and exposed communication for a layout on given hardware."""
    if ctx.invoked_subcommand is not None:
        return
    import json

    from plan.costmodel import ALLREDUCE_ALGORITHMS, Layout, Options, Workload, predict
    from plan.hardware import PlanError, load_hardware
    from plan.whatif import alternatives
    from reference_impl.config import get_preset
    from reference_impl.cp_variant import VARIANTS
    from reports.plan import render_prediction, render_whatif

    if sort not in ("ttit", "ttft"):
        fail("--sort must be ttit or ttft")
    if allreduce not in ALLREDUCE_ALGORITHMS or cp_variant not in VARIANTS:
        fail("--allreduce: ring, dda, dda-oneshot, dda-twoshot; --cp-variant: auto, pass-kv, pass-q")
    for name, v in (("--batch", batch), ("--prompt-len", prompt_len)):
        if v < 1:
            fail(f"{name} must be >= 1")
    try:
        hw = load_hardware(hardware)
        w = Workload(get_preset(model), batch=batch, prompt_len=prompt_len, cached_len=cached_len)
        if expert_imbalance < 1.0:
            raise ValueError("--expert-imbalance must be >= 1 (the busiest rank gets at least the mean)")
        if routing_from:
            from pathlib import Path

            from plan.calibrate import expert_imbalance as imbalance_of, routed_histogram

            hist = routed_histogram(Path(routing_from))
            if hist is None:
                raise ValueError(f"{routing_from}: no routed-token counts (not an MoE run, or profiled before they were recorded)")
            if hist.shape[1] != w.model.n_experts:
                raise ValueError(f"{routing_from}: routes over {hist.shape[1]} experts, {model} has {w.model.n_experts}")
            expert_imbalance = imbalance_of(hist, ep)
        lay = Layout(tp, cp, ep)
        opt = Options(allreduce=allreduce, cp_variant=cp_variant, overlap_all_to_all=overlap_all_to_all,
                      expert_imbalance=expert_imbalance)
        base = predict(w, lay, hw, opt)
        rows, skipped = alternatives(w, lay, hw, opt, what_if) if what_if else ([], [])
    except (PlanError, ValueError) as e:
        fail(str(e))
    if json_out:
        print(json.dumps({"schema": "commprobe.plan/1", "hardware": hw.name, "model": model, "base": base.to_dict(),
                          "what_if": [{"alternative": n, **p.to_dict()} for n, p in rows], "skipped": skipped}, indent=1))
        return
    render_prediction(base, f"{model} on {hw.name}: TP{tp} CP{cp} EP{ep}, batch {batch}, prompt {prompt_len}", console)
    if what_if:
        render_whatif(rows, skipped, sort, console)


@plan_app.command("calibrate")
def plan_calibrate(
    inputs: list[str] = typer.Argument(..., help="Sweep JSON files (bench collectives --json) and profile bundles."),
    output: str = typer.Option("this-machine.toml", "-o", "--output", help="Hardware profile to write."),
    name: str = typer.Option("this-machine", help="Profile name."),
) -> None:
    """Fit this machine's links (alpha, bandwidth) and compute rates from measured sweeps and profiles."""
    from pathlib import Path

    from analyzers.trace import TraceError
    from plan.calibrate import calibrate
    from plan.hardware import PlanError, to_toml

    try:
        hw, runs = calibrate(inputs, name)
    except (PlanError, TraceError, KeyError, OSError) as e:
        fail(str(e) if not isinstance(e, KeyError) else f"a bundle lacks {e} (is it a commprobe bundle?)")
    Path(output).write_text(to_toml(hw))
    console.print(f"{output}: {hw.peak_tflops * 1e3:.2f} GFLOP/s, {hw.mem_bw_GBps:.2f} GB/s, "
                  f"{hw.layer_overhead_us:.0f} µs per layer; links " + ", ".join(
                      f"{k} {v.alpha_us:.1f} µs + {v.bw_GBps:.2f} GB/s" for k, v in hw.links.items() if k not in ("intra", "inter")),
                  highlight=False, markup=False)


bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: collective sweeps.")
app.add_typer(bench_app, name="bench")


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
    import json
    import tempfile
    from pathlib import Path

    from rich.progress import Progress

    from collectives.sweep import (
        BENCH_BACKENDS,
        DTYPES,
        OPS,
        SweepConfig,
        human_size,
        parse_size,
    )
    from probe.bench import run_sweep
    from probe.launch import LaunchError

    backends = [b for b in backend.split(",") if b]
    ops = [o for o in op.split(",") if o]
    for b in backends:
        if b not in BENCH_BACKENDS:
            fail(f"unknown backend {b!r} (known: {', '.join(BENCH_BACKENDS)})")
    for o in ops:
        if o not in OPS:
            fail(f"unknown op {o!r} (known: {', '.join(OPS)})")
    if dtype not in DTYPES:
        fail(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    try:
        lo, hi = parse_size(min_size), parse_size(max_size)
    except ValueError as e:
        fail(str(e))
    if lo > hi or factor < 2 or world < 2 or batches < 1:
        fail("need --min <= --max, --factor >= 2, --world >= 2, --batches >= 1")
    from collectives.dda import usable_cores

    if world > usable_cores() and not oversubscribe:
        fail(f"world size {world} exceeds the {usable_cores()} CPU cores here; pass --oversubscribe to run anyway")
    work = Path(tempfile.mkdtemp(prefix="commprobe-bench-"))
    cfg = SweepConfig(backends=backends, ops=ops, min_bytes=lo, max_bytes=hi, factor=factor, dtype=dtype,
                      batches=batches, progress_file=str(work / "progress"))
    with Progress(console=err if json_out else console, transient=True) as bar:
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
        err.print(f"commprobe: backend {b} skipped: {why}", markup=False, highlight=False)
    if json_out:
        print(json.dumps(res["rows"], indent=1))
        return
    table = Table(title=f"{', '.join(ops)} sweep, world {world}, {dtype} (median of {batches} batches)")
    for col in ("op", "size", "count", "backend", "time_us", "algbw GB/s", "busbw GB/s", "vs dda"):
        table.add_column(col, justify="right", no_wrap=True)
    dda = {(r["op"], r["bytes"]): r["time_us"] for r in res["rows"] if r["backend"] == "dda"}
    for r in res["rows"]:
        ref = dda.get((r["op"], r["bytes"]))
        ratio = f"{r['time_us'] / ref:.2f}x" if ref and r["backend"] != "dda" else ""
        table.add_row(r["op"], human_size(r["bytes"]), str(r["count"]), r["backend"], f"{r['time_us']:.1f}",
                      f"{r['algbw_GBps']:.2f}", f"{r['busbw_GBps']:.2f}", ratio)
    console.print(table)
    console.print(f"single-thread copy bandwidth: {res['copy_GBps']:.1f} GB/s (bytes copied per second); "
              "'vs dda' = backend time / DDA time", highlight=False)


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
    import json
    import statistics
    import tempfile
    from pathlib import Path

    from collectives.dda import usable_cores
    from collectives.sweep import human_size, parse_size
    from collectives.timeshare import TimeShareConfig
    from probe.bench import run_time_sharing
    from probe.launch import LaunchError

    cores = usable_cores()
    if backend not in ("dda", "gloo"):
        fail(f"unknown backend {backend!r} (time-sharing knows dda, gloo)")
    try:
        work_bytes = [parse_size(w) for w in work.split(",") if w.strip()]
        message = parse_size(size)
    except ValueError as e:
        fail(str(e))
    if not work_bytes or rounds < 1:
        fail("need at least one --work size and --rounds >= 1")
    if world <= cores or world > 4 * cores:
        fail(f"--world must exceed the {cores} usable cores here (and be at most {4 * cores}): "
             "this measures ranks that time-share cores")
    workdir = Path(tempfile.mkdtemp(prefix="commprobe-bench-"))
    cfg = TimeShareConfig(work_bytes=work_bytes, message_bytes=message, backend=backend, cores=cores, rounds=rounds,
                          progress_file=str(workdir / "progress"))
    try:
        rows = run_time_sharing(cfg, world, timeout=timeout, workdir=workdir / "ranks")
    except LaunchError as e:
        fail(str(e), code=1)
    if json_out:
        print(json.dumps(rows, indent=1))
        return
    table = Table(title=f"time-sharing: {world} ranks on {cores} cores, {backend} allreduce of {size} after each "
                  f"piece of work (medians of {rounds} alternated rounds)")
    for col in ("work", f"{cores} ranks µs/call", f"{world} ranks µs/call", "interval µs", "extra µs/call"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(human_size(r["work_bytes"]), f"{statistics.median(r['base_us']):.0f}",
                      f"{statistics.median(r['shared_us']):.0f}", f"{r['interval_us']:.0f}", f"{r['extra_us']:.0f}")
    console.print(table)
    console.print("extra = (all ranks - ranks/cores x one per core) / (ranks/cores - 1); "
                  "`commprobe plan calibrate` reads the --json rows", highlight=False)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("commprobe: interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
