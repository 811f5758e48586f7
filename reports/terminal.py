"""Terminal rendering (rich) of analyzer results. It formats; it computes nothing new."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from commprobe.common.vocab import WORK_CATEGORIES, Verdict

CATS = WORK_CATEGORIES


def render_analysis(result: dict, console: Console) -> None:
    src = result["source"]
    console.print(f"[bold]commprobe analyze[/]: {escape(src['path'])} ({len(src['files'])} rank trace(s), "
                  f"{src['uncompressed_bytes'] / 1e6:.1f} MB, {result['elapsed_s']:.2f} s)", highlight=False)
    formats = src.get("formats") or {}
    if set(formats) - {"kineto json"}:
        console.print("read as: " + ", ".join(f"{escape(f)} ({n} rank(s))" for f, n in formats.items()), highlight=False)
    for note in src.get("reader_notes", ()):
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    for phase, p in result["phases"].items():
        style = {Verdict.COMMUNICATION: "bold red", Verdict.HOST: "bold yellow", Verdict.DATA_MOVEMENT: "bold yellow"}.get(
            p["verdict"], "bold green")
        console.print(f"[{style}]{escape(p['summary'])}[/]", highlight=False)
        for rec in p["recommendations"]:
            console.print(f"  - {escape(rec)}", highlight=False)
        for note in p.get("notes", []):
            console.print(f"  note: {escape(note)}", highlight=False)
    table = Table(title="Exposed time per rank and phase (µs per window; share of end-to-end)")
    for col in ("rank", "phase", "e2e", *CATS, "idle"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in result["ranks"]:
        for phase, p in r["phases"].items():
            w, e2e = p["windows"], p["e2e_us"] or 1.0
            cells = [f"{p['categories'][c]['exposed_us'] / w:.0f} ({p['categories'][c]['exposed_us'] / e2e:.0%})" for c in CATS]
            table.add_row(str(r["rank"]), phase, f"{p['e2e_us'] / w:.0f}", *cells,
                          f"{p['idle_us'] / w:.0f} ({p['idle_us'] / e2e:.0%})")
    console.print(table)
    coll = result["collectives"]
    if coll["matched_calls"]:
        t = Table(title=f"Collectives matched across ranks: {coll['matched_calls']} calls"
                        + (f"; straggler: rank {coll['straggler']}" if coll["straggler"] is not None else ""))
        for col in ("rank", "calls", "transfer µs", "wait for straggler µs", "times last"):
            t.add_column(col, justify="right")
        for r in coll["ranks"]:
            t.add_row(str(r["rank"]), str(r["calls"]), f"{r['transfer_us']:.0f}", f"{r['wait_us']:.0f}", str(r["times_last"]))
        console.print(t)
    if result["message_sizes"]:
        t = Table(title="Collective latency by message size")
        for col in ("op", "axis", "axis from", "≤ bytes", "count", "median µs", "p90 µs", "algbw GB/s", "busbw GB/s"):
            t.add_column(col, justify="right")
        for b in result["message_sizes"]:
            t.add_row(escape(b["op"]), b["axis"], b.get("axis_source", ""), str(b["bucket_bytes"]), str(b["count"]),
                      f"{b['median_us']:.1f}",
                      f"{b['p90_us']:.1f}", f"{b['algbw_GBps']:.2f}", f"{b['busbw_GBps']:.2f}")
        console.print(t)
    links = result.get("kernel_links") or {}
    if links.get("comm_kernels"):
        console.print(f"communication kernels linked to their host op: {links['linked']} of {links['comm_kernels']} "
                      f"(no launch in the trace: {links['no_launch']}, outside any host collective: "
                      f"{links['outside_host_op']})", highlight=False)
    u = result["unclassified"]
    if u["count"]:
        names = ", ".join(escape(n["name"][:40]) for n in u["names"][:5])
        console.print(f"unclassified events: {u['count']} ({names}…); add a --rules file to classify them", highlight=False)


def render_hang(result: dict, console: Console) -> None:
    """The hang diagnosis (commprobe.hang/1): findings first, one table row per rank's stack."""
    console.print(f"[bold]commprobe hang[/]: {escape(result['source'])} (records of ranks "
                  f"{', '.join(map(str, result['ranks'])) or 'none'})", highlight=False)
    if not result["findings"]:
        console.print("[green]no finding: every group's ranks agree and none is stuck in a collective[/]")
    for f in result["findings"]:
        console.print(f"[bold red]{escape(f['kind'])}[/]: {escape(f['summary'])}", highlight=False)
        table = Table(show_header=True, header_style="bold", box=None)
        for col in ("rank", "role", "where (file:line, function)"):
            table.add_column(col)
        for r, s in f["stacks"].items():
            role = "missing" if int(r) in f["missing"] else "waits" if int(r) in f["concerned"] else ""
            at = f"{s['file']}:{s['line']} ({s['name']})" if s else "?"
            table.add_row(r, role, escape(at))
        console.print(table)
    for n in result.get("notes", ()):
        console.print(f"[yellow]note:[/] {escape(n)}", highlight=False)


def render_compare(result: dict, console: Console) -> None:
    console.print(f"[bold]commprobe compare[/]: A = {escape(result['a'])}, B = {escape(result['b'])} (ratio B/A)")
    t = Table(title="Per phase (µs per window)")
    for col in ("phase", "category", "A", "B", "B/A"):
        t.add_column(col, justify="right")
    for ph, p in result["phases"].items():
        t.add_row(ph, "end-to-end", f"{p['a_e2e_us']:.0f}", f"{p['b_e2e_us']:.0f}", _r(p["ratio"]))
        for c, v in p["categories"].items():
            if v["a_us"] or v["b_us"]:
                t.add_row("", c, f"{v['a_us']:.0f}", f"{v['b_us']:.0f}", _r(v["ratio"]))
    console.print(t)
    if result["message_sizes"]:
        t = Table(title="Collective median latency by message size")
        for col in ("op", "≤ bytes", "A µs", "B µs", "B/A"):
            t.add_column(col, justify="right")
        for r in result["message_sizes"]:
            t.add_row(escape(r["op"]), str(r["bucket_bytes"]), f"{r['a_median_us']:.1f}", f"{r['b_median_us']:.1f}", _r(r["ratio"]))
        console.print(t)


def _r(x) -> str:
    return f"{x:.2f}x" if x is not None else "-"


# ---- tables of `commprobe profile` and `commprobe bench` ----

def render_profile(results: list, backends: list[str], axes: list[str], console: Console) -> None:
    """Per backend, TTFT/TTIT/tokens/s per rank and the share blocked in each axis's collectives
    (probe.run.RankResult rows: their timings are what the ranks measured)."""
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


def render_next_steps(out: str, verdicts: dict[str, dict | str], console: Console) -> None:
    """The run's verdict (per backend and phase, from each sub-bundle's analysis `phases`) and
    the commands that dig further, the way git says what to do next. A backend maps to its
    phases, or to why there is no analysis."""
    console.print(f"bundle: {out}", highlight=False, markup=False, soft_wrap=True)
    console.print("verdict:", highlight=False, markup=False)
    for b, phases in verdicts.items():
        if isinstance(phases, str):
            console.print(f"  {b}: no analysis ({phases})", highlight=False, markup=False)
            continue
        for ph, p in phases.items():
            console.print(f"  {b:<5} {ph:<8} {p['verdict']:<20} exposed communication {p['exposed_comm_share']:.0%}; "
                          f"largest: {p.get('largest', p['dominant'])} {p.get('largest_share', p['dominant_share']):.0%}", highlight=False, markup=False)
    subs = list(verdicts)
    one = out if len(subs) == 1 else f"{out}/{subs[0]}"
    steps = [(f"commprobe analyze {one}", "where the time goes per rank; collectives matched across ranks"),
             (f"commprobe report {out} -o report.html", "one HTML page: breakdown, timelines, telemetry")]
    if len(subs) > 1:
        steps.append((f"commprobe compare {out}/{subs[0]} {out}/{subs[1]}", f"{subs[1]} against {subs[0]}, B/A"))
    else:
        steps.append(("commprobe profile --backend gloo,dda --out runs/ab", "then compare runs/ab/gloo runs/ab/dda"))
    console.print("next:", highlight=False, markup=False)
    width = max(len(c) for c, _ in steps)
    for cmd, why in steps:
        console.print(f"  {cmd:<{width}}  # {why}", highlight=False, markup=False, soft_wrap=True)  # copyable


def render_sweep(res: dict, ops: list[str], world: int, dtype: str, batches: int, console: Console) -> None:
    from commprobe.common.units import human_size

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


def render_time_sharing(rows: list[dict], world: int, cores: int, backend: str, size: str, rounds: int,
                        console: Console) -> None:
    import statistics

    from commprobe.common.units import human_size

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
