"""Terminal rendering (rich) of analyzer results. It formats; it computes nothing new."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

CATS = ("compute", "tp_allreduce", "cp_ring", "ep_all_to_all", "other_comm", "memcpy", "other")


def render_analysis(result: dict, console: Console) -> None:
    src = result["source"]
    console.print(f"[bold]commprobe analyze[/]: {escape(src['path'])} ({len(src['files'])} rank trace(s), "
                  f"{src['uncompressed_bytes'] / 1e6:.1f} MB, {result['elapsed_s']:.2f} s)", highlight=False)
    for phase, p in result["phases"].items():
        style = {"communication-bound": "bold red", "host/launch-bound": "bold yellow"}.get(p["verdict"], "bold green")
        console.print(f"[{style}]{escape(p['summary'])}[/]", highlight=False)
        for rec in p["recommendations"]:
            console.print(f"  - {escape(rec)}", highlight=False)
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
        for col in ("op", "axis", "≤ bytes", "count", "median µs", "p90 µs", "algbw GB/s", "busbw GB/s"):
            t.add_column(col, justify="right")
        for b in result["message_sizes"]:
            t.add_row(escape(b["op"]), b["axis"], str(b["bucket_bytes"]), str(b["count"]), f"{b['median_us']:.1f}",
                      f"{b['p90_us']:.1f}", f"{b['algbw_GBps']:.2f}", f"{b['busbw_GBps']:.2f}")
        console.print(t)
    u = result["unclassified"]
    if u["count"]:
        names = ", ".join(escape(n["name"][:40]) for n in u["names"][:5])
        console.print(f"unclassified events: {u['count']} ({names}…); add a --rules file to classify them", highlight=False)


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
