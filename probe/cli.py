"""The `commprobe` command line. Thin: it parses options, builds the library's config objects
(which check themselves), calls the library and hands results to reports/ to print. The
`plan` and `bench` command groups live in cli_plan.py and cli_bench.py.

Bad input is one line on stderr and exit status 2 (any `InputError` or config ValueError);
a failed rank is one line and status 1.
"""

from __future__ import annotations

import os
import sys
import time

# numpy's OpenBLAS starts a spinning thread per core at import; nothing here multiplies matrices
# with numpy (the analysis is searches and sorts, the model runs in torch), and on a 2-core host
# those threads take the cores a --jobs pool's workers need. A user's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import typer

from commprobe.common import jsonout
from commprobe.common.bundle import MANIFEST
from commprobe.common.errors import InputError

from .cli_bench import bench_app
from .cli_calibrate import calibrate
from .cli_plan import plan_app
from .console import check_cores, console, err, fail, one_line, say

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Profile and diagnose communication bottlenecks in distributed LLM inference.",
)
app.command()(calibrate)
app.add_typer(plan_app, name="plan")
app.add_typer(bench_app, name="bench")


@app.callback()
def _root() -> None:
    """Profile and diagnose communication bottlenecks in distributed LLM inference."""


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

    from commprobe.collectives.backends import process_group_backend
    from commprobe.probe.launch import LaunchError, under_torchrun
    from commprobe.probe.profile import run_profile, run_profile_torchrun
    from commprobe.probe.run import RunConfig
    from commprobe.reports.terminal import render_next_steps, render_profile

    if telemetry_interval <= 0:
        fail("--telemetry-interval must be > 0")
    out = Path(out_dir or f"runs/profile-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        cfg = RunConfig(preset=preset, tp=tp, cp=cp, ep=ep, cp_variant=cp_variant, device=device, batch=batch,
                        prompt_len=prompt_len, decode_steps=steps, repeats=repeats, seed=seed, checkpoint=checkpoint,
                        backends=backend, timeout=timeout, out_dir=str(out))
        mcfg = cfg.model_config()
        mesh = cfg.mesh
    except ValueError as e:
        fail(str(e))
    if out.exists() and not out.is_dir():
        fail(f"--out {out} exists and is not a directory")
    first = not under_torchrun() or int(os.environ.get("RANK", 0)) == 0  # other ranks would see rank 0's
    if first and out.is_dir() and (out / MANIFEST).exists():
        fail(f"--out {out} already holds a bundle; choose another directory")
    pg_backend = process_group_backend(cfg.backends)
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # keep Kineto's start/stop chatter off the terminal

    if under_torchrun():
        results = run_profile_torchrun(cfg, mcfg.to_dict(), pg_backend=pg_backend,
                                       telemetry_interval=telemetry_interval)
        if int(os.environ.get("RANK", 0)) != 0:
            return  # rank 0 prints the run's table
    else:
        check_cores(cfg.world_size, oversubscribe)
        console.print(f"[bold]commprobe profile[/]: preset {mcfg.name}, backend {','.join(cfg.backends)}, "
                      f"batch {batch}, prompt {prompt_len}, {steps} decode steps x {repeats} repeats", highlight=False)
        say(mesh.describe())
        try:
            results = run_profile(cfg, mcfg.to_dict(), pg_backend=pg_backend, telemetry_interval=telemetry_interval,
                                  on_status=say).results
        except LaunchError as e:
            found = f"\n{e.finding} (commprobe hang {out})" if getattr(e, "finding", None) else ""
            fail(f"{e} (partial bundle kept in {out}){found}", code=1)
        except OSError as e:
            fail(f"cannot write the bundle in {out}: {e.strerror or e}", code=1)
    render_profile(results, cfg.backends, [a for a in ("tp", "cp", "ep") if getattr(mesh, a) > 1], console)
    render_next_steps(str(out), _verdicts(cfg), console)


def _verdicts(cfg) -> dict[str, dict | str]:
    """Per backend, the phases of the fresh bundle's analysis (or why there is none): a first
    run ends in a verdict, not only a table."""
    from commprobe.analyzers.analysis import analyze

    out: dict[str, dict | str] = {}
    for b in cfg.backends:
        try:
            out[b] = analyze(cfg.bundle_dir(b))["phases"]
        except InputError as e:
            out[b] = str(e)
    return out


@app.command()
def analyze(
    path: str = typer.Argument(..., help="A run bundle, a trace file, or a directory of rank traces."),
    json_out: bool = typer.Option(False, "--json", help="Print the versioned JSON result."),
    rules: str | None = typer.Option(None, help="Classification rules file (TOML or JSON)."),
    threshold: float = typer.Option(0.2, help="Exposed-communication share above which a phase is communication-bound (its transfer), "
                                   "imbalance-bound (its waiting for a late rank) or both."),
    align: str = typer.Option("base", help="Clock alignment: base (baseTimeNanoseconds) or collective-end."),
    out_file: str | None = typer.Option(None, "--out", help="Also write the JSON result to this file."),
    jobs: int = typer.Option(0, help="Ranks analyzed at once, each in its own process (0: the usable cores)."),
    scheduler: str | None = typer.Option(None, envvar="COMMPROBE_DASK_SCHEDULER",
                                         help="A Dask scheduler (tcp://host:port): analyze the ranks on its cluster."),
    rank_from: str | None = typer.Option(None, help="Nsight exports: a regex whose first group, in the file name, "
                                                    "is the rank (e.g. 'node(\\d+)')."),
    wide: bool = typer.Option(False, "--wide", help="Every category a column, those with no time too."),
    calibration: str | None = typer.Option(None, help="This machine's collectives measured: a sweep (`commprobe bench "
                                           "collectives --json > FILE`) or a profiled run per backend (`profile "
                                           "--backend gloo,dda`), several joined by commas: the zero-skew baseline that "
                                           "tells a slow transport from its floor (default: the trace's own fastest "
                                           "calls), and what switching to each backend would save (headroom)."),
    perfetto: str | None = typer.Option(None, help="Also write one merged trace of every rank, aligned, with the "
                                        "findings as tracks (phases and verdicts, exposed communication, waiting for "
                                        "rank R, flows from the last arriver): OUT.json or OUT.json.gz, for "
                                        "ui.perfetto.dev or chrome://tracing."),
    ranks: str | None = typer.Option(None, help="With --perfetto: only these ranks (0,3 or 0-3)."),
    window: str | None = typer.Option(None, help="With --perfetto: only this phase's windows (prefill, decode, step)."),
) -> None:
    """Attribute end-to-end latency to compute, TP allreduce, CP ring and EP all-to-all; give a verdict."""
    from commprobe.analyzers.analysis import analyze as run_analysis
    from commprobe.analyzers.cross_rank.rank_map import default_jobs

    n_jobs = default_jobs() if jobs == 0 else jobs
    if perfetto:
        from commprobe.analyzers.perfetto import export

        done = export(path, perfetto, ranks=ranks, window=window, rules_file=rules, align=align, rank_from=rank_from,
                      threshold=threshold, calibration=calibration, jobs=n_jobs)
        result = done["result"]
        say(f"perfetto: {done['path']} ({done['events']} events, ranks {', '.join(map(str, sorted(done['written'])))}"
            f"): open it at https://ui.perfetto.dev", to_err=json_out)
    elif ranks or window:
        fail("--ranks and --window cut the --perfetto trace: give --perfetto OUT.json too")
    else:
        result = run_analysis(path, rules_file=rules, threshold=threshold, align=align, jobs=n_jobs,
                              scheduler=scheduler, rank_from=rank_from, calibration=calibration)
    if out_file:
        from pathlib import Path

        Path(out_file).write_text(jsonout.dumps(result))
    if json_out:
        print(jsonout.dumps(result))
    else:
        from commprobe.reports.terminal import render_analysis

        render_analysis(result, console, wide=wide)
    _done_with_objects()


def _done_with_objects() -> None:
    """Nothing this process made is freed before it exits, so the interpreter's last garbage
    collections need not look at it: `gc.freeze` moves every object out of their sight (files,
    atexit handlers and finalizers run as usual). Those collections cost 20-50 ms at the end of an
    analysis of 16 ranks, the whole process 0.7-1.0 s (bench/RESULTS.md)."""
    import gc

    gc.freeze()


@app.command()
def report(
    path: str = typer.Argument(..., help="A run bundle (several backends: all compared), trace(s), or an analysis JSON."),
    other: str | None = typer.Argument(None, help="A second run to compare against the first (B against A)."),
    output: str = typer.Option("report.html", "-o", "--output", help="Where to write the HTML report."),
    json_out: bool = typer.Option(False, "--json", help="Print the analysis result as JSON instead of the summary."),
    plan_file: str | None = typer.Option(None, "--plan", help="A `commprobe plan --json` result: adds the what-if panel."),
    calibration: str | None = typer.Option(None, help="As `analyze --calibration`: adds what switching to each "
                                           "calibrated backend would save."),
) -> None:
    """One self-contained HTML report (plotly.js embedded) of an analysis, plus the terminal summary;
    two backends or two runs get a comparison page."""
    from pathlib import Path

    from commprobe.analyzers.analysis import report_inputs
    from commprobe.reports.html import render_hang_page, render_html
    from commprobe.reports.terminal import render_analysis, render_hang

    plan = None
    if plan_file:
        from commprobe.plan.request import load_plan_doc

        plan = load_plan_doc(plan_file)
    got = report_inputs(path, other, calibration)
    result = got["result"]
    page = (render_html(result, got["by_label"], plan, got["comparisons"], got["hang"]) if result is not None
            else render_hang_page(got["hang"]))
    try:
        Path(output).write_text(page, encoding="utf-8")
    except OSError as e:
        fail(f"cannot write {output}: {e.strerror or e}", code=1)
    if json_out:
        print(jsonout.dumps(result if result is not None else got["hang"]))
        return
    if got["hang"]:
        render_hang(got["hang"], console)
    if result is not None:
        render_analysis(result, console)
    say(f"report: {output}")


@app.command()
def gate(
    current: list[str] = typer.Option(..., help="The run to judge: a bundle, an analysis JSON, or a baseline file. "
                                      "With --update-baseline, repeat it to pool several runs into the baseline."),
    baseline: str = typer.Option(..., help="Baseline file (commprobe.baseline/1); written with --update-baseline."),
    metric: list[str] = typer.Option([], help="Metric name or glob (repeatable), e.g. 'ttit_ms' or 'dda/*'. Default: all in the baseline."),
    max_regression: str = typer.Option("10%", help="Time metrics: largest tolerated slowdown of the median."),
    max_share_increase: str = typer.Option("5pp", help="Share metrics: largest tolerated rise, in percentage points."),
    alpha: float = typer.Option(0.01, help="Significance level of the one-sided Mann-Whitney U test."),
    min_samples: int = typer.Option(5, help="Fewer samples than this on either side is unusable input (exit 2)."),
    update_baseline_: bool = typer.Option(False, "--update-baseline", help="Write --current's metrics (all runs' samples pooled) and machine facts to --baseline and exit."),
    markdown: str | None = typer.Option(None, help="Write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)."),
    junit: str | None = typer.Option(None, help="Write JUnit XML here."),
    json_file: str | None = typer.Option(None, "--json", help="Write the JSON result here ('-' for stdout)."),
) -> None:
    """CI regression gate: exit 0 pass, 1 regression, 2 unusable input (fails closed)."""
    from pathlib import Path

    from commprobe.common.units import parse_fraction
    from commprobe.gate import Thresholds, gate_one, update_baseline
    from commprobe.reports.gate import render_gate, to_junit, to_markdown

    th = Thresholds(parse_fraction(max_regression, "--max-regression"),
                    parse_fraction(max_share_increase, "--max-share-increase", points=True), alpha, min_samples)
    if update_baseline_:
        done = update_baseline(current, baseline, th)
        for line in done.left_out:
            say(line)
        say(f"baseline: {done.stored} metrics from {done.source} written to {done.path}")
        return
    res = gate_one(baseline, current, metric, th).to_dict()
    try:
        if markdown:
            with open(markdown, "a", encoding="utf-8") as f:  # append: CI step summaries accumulate
                f.write(to_markdown(res))
        if junit:
            Path(junit).write_text(to_junit(res), encoding="utf-8")
        if json_file and json_file != "-":
            Path(json_file).write_text(jsonout.dumps(res), encoding="utf-8")
    except OSError as e:
        fail(f"cannot write a gate report: {e.strerror or e}")
    if json_file == "-":
        print(jsonout.dumps(res))
    else:
        render_gate(res, console)
    raise typer.Exit(res["exit_code"])


@app.command()
def capture(
    url: str = typer.Argument(..., help="The server's base URL, e.g. http://127.0.0.1:8000"),
    engine: str = typer.Option("auto", help="auto, vllm, sglang or trtllm (auto asks the server)."),
    requests: int = typer.Option(8, help="Requests to send while profiling."),
    concurrency: int = typer.Option(2, help="Requests in flight at once."),
    prompt_len: int = typer.Option(32, help="Prompt tokens per request (the server's tokenizer, where it answers /tokenize)."),
    max_tokens: int = typer.Option(16, help="Tokens generated per request."),
    trace_dir: str | None = typer.Option(None, help="Where the server's profiler writes its traces."),
    out: str | None = typer.Option(None, "--out", help="The bundle to write (default runs/capture-TIMESTAMP)."),
    timeout: float = typer.Option(300.0, help="Seconds to wait for requests and for the traces."),
    json_out: bool = typer.Option(False, "--json", help="Print the analysis and the capture facts as JSON."),
) -> None:
    """Profile a live inference server under a known load, collect every rank's trace into a bundle, analyze it."""
    import time

    from rich.console import Console
    from rich.progress import Progress

    from commprobe.analyzers.analysis import analyze as run_analysis
    from commprobe.probe.capture import CaptureConfig, client_summary, record_prefill
    from commprobe.probe.capture import capture as run_capture
    from commprobe.reports.terminal import render_analysis, render_next_steps

    cfg = CaptureConfig(url, engine, requests, concurrency, prompt_len, max_tokens, trace_dir,
                        out or f"runs/capture-{time.strftime('%Y%m%d-%H%M%S')}", timeout)
    with Progress(console=Console(stderr=True), transient=True, disable=json_out) as bar:
        task = bar.add_task("requests", total=requests)
        cap = run_capture(cfg, on_status=lambda s: bar.update(task, description=s),
                          on_request=lambda done, total: bar.update(task, completed=done))
    result = run_analysis(cap.bundle)
    facts = {"engine": cap.engine, "version": cap.version, "bundle": str(cap.bundle), "files": cap.files,
             **client_summary(cap), "prefill_tokens": record_prefill(cap, result, prompt_len)}
    if json_out:
        print(jsonout.dumps({"capture": facts, "analysis": result}))
        return
    c = facts
    say(f"capture: {c['engine']} {c['version'] or ''}, {c['requests']} requests ({c['failed']} failed), "
        f"client TTFT median {c['ttft_ms'] or 0:.1f} ms (target < 350), TTIT median {c['ttit_ms'] or 0:.1f} ms "
        f"(target < 25); {len(cap.files)} trace file(s) in {cap.bundle}")
    render_analysis(result, console)
    render_next_steps(str(cap.bundle), {cap.engine: result["phases"]}, console, source="capture")


@app.command()
def hang(
    path: str = typer.Argument(..., help="A run bundle, or a directory of Flight Recorder dumps (one file per rank); "
                               "with --live, a running job's sockets: a run directory, a directory or glob of "
                               "sockets, or a comma-separated list (127.0.0.1:PORT too)."),
    live: bool = typer.Option(False, "--live", help="Ask the running job's ranks now: hang, straggler or running."),
    ras: bool = typer.Option(False, "--ras", help="PATH is NCCL RAS's port (127.0.0.1:28028): ask it twice, "
                             "--interval apart (a file of `ncclras` output is read without it)."),
    watch: float = typer.Option(0.0, help="With --live: ask again every this many seconds, a live table (Ctrl-C stops)."),
    interval: float = typer.Option(2.0, help="With --live: seconds over which the ranks are polled."),
    timeout: float = typer.Option(5.0, help="With --live: seconds a rank has to answer each poll."),
    json_out: bool = typer.Option(False, "--json", help="Print the diagnosis as JSON (schema commprobe.hang/2)."),
) -> None:
    """Why a run hung: which rank, group, collective and sequence number, and where each rank waits."""
    from commprobe.analyzers.hang import analyze_hang
    from commprobe.reports.live import render_live
    from commprobe.reports.terminal import render_hang

    if ras:
        from commprobe.analyzers.hang_ras import ask as ask_ras

        if interval <= 0 or timeout <= 0:
            fail("--interval and --timeout must be > 0")
        result = ask_ras(path, interval=interval, timeout=timeout)
        print(jsonout.dumps(result)) if json_out else render_hang(result, console)
        return
    if live:
        from commprobe.analyzers.hang_live import live as ask

        if interval <= 0 or timeout <= 0 or watch < 0:
            fail("--interval and --timeout must be > 0, --watch >= 0")
        while True:
            result = ask(path, interval=interval, timeout=timeout)
            if not result["ranks"]:  # nobody answered: one line, as any unusable input
                fail(result["notes"][0] if result["notes"] else "no rank answered")
            if json_out:
                print(jsonout.dumps(result), flush=True)
            else:
                if watch:
                    console.clear()
                render_live(result, console)
            if not watch:
                raise typer.Exit(0 if result["state"] == "running" else 1)
            time.sleep(watch)
    result = analyze_hang(path)
    if json_out:
        print(jsonout.dumps(result))
    else:
        render_hang(result, console)


@app.command()
def compare(
    a: str = typer.Argument(..., help="Baseline: bundle, trace(s) or analysis JSON."),
    b: str = typer.Argument(..., help="Candidate: bundle, trace(s) or analysis JSON."),
    json_out: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
) -> None:
    """Two analyses side by side (gloo vs dda, NCCL vs DDA, before vs after), with B/A ratios."""
    from commprobe.analyzers.analysis import compare as run_compare
    from commprobe.analyzers.analysis import load_result
    from commprobe.reports.terminal import render_compare

    result = run_compare(load_result(a), load_result(b))
    if json_out:
        print(jsonout.dumps(result))
    else:
        render_compare(result, console)


def main() -> None:
    try:
        app()
    except InputError as e:  # raised where the input was read, naming it: one line, exit 2
        err.print(f"commprobe: error: {one_line(str(e))}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("commprobe: interrupted")
        sys.exit(130)
    except SystemExit as e:  # typer turns Ctrl-C inside a command into a silent exit 130
        if e.code == 130:
            err.print("commprobe: interrupted")
        raise


if __name__ == "__main__":
    main()
