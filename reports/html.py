"""Self-contained HTML report of an analysis result (plotly.js embedded: opens offline).

It renders what the analyzers computed and computes nothing new. Every string that came from
a trace or a manifest is HTML-escaped where it lands in markup, and figure JSON placed inside a
<script> element has "</" written as "<\\/", so a kernel named `</script><script>…` stays text.
"""

from __future__ import annotations

import json

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from commprobe.common.vocab import WORK_CATEGORIES

from .sections import (
    COLORS,
    add_segment_bars,
    cause_section,
    comparison_section,
    engine_phases_section,
    hang_section,
    headroom_section,
    timelines_figure,
)
from .sections import esc as _esc
from .sections import verdict_class as _verdict_class
from .traffic_figure import traffic_figures, traffic_section

CATS = WORK_CATEGORIES


def _script_json(obj) -> str:
    return json.dumps(obj).replace("</", "<\\/")


def breakdown_figure(result: dict) -> go.Figure:
    """Stacked exposed time per phase and rank (µs per window); each communication category shows
    its transfer, and the time its collectives waited for a straggler is its own segment."""
    fig = go.Figure()
    rows = [(r["rank"], ph, p) for r in result["ranks"] for ph, p in r["phases"].items()]
    labels = [f"{ph} · rank {rank}" for rank, ph, _ in rows]

    def wait(cat: dict) -> float:
        return cat.get("exposed_wait_us", 0.0)

    for c in CATS:
        fig.add_bar(name=c, x=labels, marker_color=COLORS[c],
                    y=[(p["categories"][c]["exposed_us"] - wait(p["categories"][c])) / p["windows"] for _, _, p in rows])
    fig.add_bar(name="straggler wait", x=labels, marker_color=COLORS["straggler wait"],
                y=[sum(wait(v) for v in p["categories"].values()) / p["windows"] for _, _, p in rows])
    kinds = {r.get("timeline") for r in result["ranks"]}
    idle = "outside ops (host)" if kinds == {"host"} else "idle" if kinds == {"device"} else "idle / outside ops"
    fig.add_bar(name=idle, x=labels, y=[p["idle_us"] / p["windows"] for _, _, p in rows], marker_color=COLORS["idle"],
                hovertext=[r.get("idle_means", "") for r in result["ranks"] for _ in r["phases"]])
    fig.update_layout(barmode="stack", title="Exposed time per phase and rank (µs per window; straggler wait split out)",
                      yaxis_title="µs", legend_title="category", height=420)
    return fig


def _sizes_figure(by_label: dict[str, dict], title: str, height: int) -> go.Figure:
    """Median latency (solid) and busbw (dotted) per op and message-size bucket, one line per label
    (a backend, or "" for a single analysis), on log axes."""
    fig = go.Figure()
    for label, res in by_label.items():
        prefix = f"{label} " if label else ""
        for op in sorted({b["op"] for b in res["message_sizes"]}):
            bs = sorted((b for b in res["message_sizes"] if b["op"] == op), key=lambda b: b["bucket_bytes"])
            fig.add_scatter(name=f"{prefix}{op} latency", x=[b["bucket_bytes"] for b in bs],
                            y=[b["median_us"] for b in bs], mode="lines+markers")
            fig.add_scatter(name=f"{prefix}{op} busbw", x=[b["bucket_bytes"] for b in bs],
                            y=[b["busbw_GBps"] for b in bs], mode="lines+markers", yaxis="y2", line={"dash": "dot"})
    fig.update_layout(title=title, xaxis={"type": "log", "title": "bytes", "tickformat": "~s"},
                      yaxis={"type": "log", "title": "median µs", "tickformat": "~s"},
                      yaxis2={"type": "log", "title": "busbw GB/s", "overlaying": "y", "side": "right", "tickformat": ".2~g"},
                      height=height, legend={"orientation": "h", "y": -0.2})
    return fig


def sizes_figure(result: dict) -> go.Figure:
    return _sizes_figure({"": result}, "Collective latency and busbw by message size", 420)


def timeline_figure(result: dict, phase: str) -> go.Figure | None:
    """One window of `phase` per rank (the prefill; the middle decode step): what ran when."""
    rows = [(r["rank"], r["segments"][phase]) for r in result["ranks"] if phase in r.get("segments", {})]
    if not rows:
        return None
    fig = go.Figure()
    add_segment_bars(fig, [(f"rank {rank}", seg) for rank, seg in rows])
    which = "the prefill" if phase == "prefill" else f"{phase} window {rows[0][1]['window']}"
    fig.update_layout(barmode="overlay", title=f"Per-rank timeline of {which} (exposed time; µs from the window's start)",
                      xaxis_title="µs", height=max(300, 140 + 40 * len(rows)), legend_title="category")
    fig.update_yaxes(categoryorder="category descending")
    return fig


def backends_figure(by_backend: dict[str, dict]) -> go.Figure | None:
    """The same per backend (gloo vs DDA, NCCL vs DDA): a run with two or more backends."""
    if len(by_backend) < 2 or not any(r["message_sizes"] for r in by_backend.values()):
        return None
    return _sizes_figure(by_backend, "Collective latency (solid) and busbw (dotted) by message size, per backend", 460)


def telemetry_figure(result: dict) -> go.Figure | None:
    """Telemetry series on the traces' clock, one panel per unit, the phases shaded (rank 0's windows)."""
    tel = result.get("telemetry") or {}
    series = tel.get("series") or {}
    if not series:
        return None
    from plotly.subplots import make_subplots

    units = sorted({s["unit"] for s in series.values()})
    fig = make_subplots(rows=len(units), cols=1, shared_xaxes=True, subplot_titles=units, vertical_spacing=0.06)
    wins = result["ranks"][0].get("windows", {}) if result["ranks"] else {}
    t0 = min((sp[0][0] for sp in wins.values() if sp), default=0.0)
    for label, s in series.items():
        fig.add_scatter(name=label, x=[(t - t0) / 1e6 for t in s["t_us"]], y=s["v"], mode="lines",
                        row=units.index(s["unit"]) + 1, col=1)
    colors = {"prefill": "rgba(69,117,180,0.18)", "decode": "rgba(244,109,67,0.12)"}
    # labels of adjacent bands must not overlap at any width: alternate their corners
    corners = ("top left", "top right", "bottom left", "bottom right")
    for n, (phase, spans) in enumerate(wins.items()):
        if not spans:
            continue
        # One shaded band per phase (decode steps are back to back), from its first to its last window.
        fig.add_vrect(x0=(spans[0][0] - t0) / 1e6, x1=(spans[-1][1] - t0) / 1e6, line_width=0,
                      fillcolor=colors.get(phase, "rgba(120,120,120,0.12)"), annotation_text=phase,
                      annotation_position=corners[n % len(corners)])
    fig.update_layout(title="Telemetry aligned to the phases (s from the first phase; shaded: rank 0's phase windows)",
                      height=240 * len(units) + 80)
    fig.update_xaxes(title_text="s", row=len(units), col=1)
    return fig


def plan_panel(plan: dict | None) -> str:
    """The what-if table of a `commprobe plan --json` result, sorted by TTIT."""
    if not plan:
        return ""
    rows = [("base", plan["base"])] + [(w["alternative"], w) for w in plan.get("what_if", [])]
    rows.sort(key=lambda r: r[1]["ttit_ms"])
    body = "".join(
        f"<tr><td>{_esc(name)}</td><td>TP{p['layout']['tp']} CP{p['layout']['cp']} EP{p['layout']['ep']}</td>"
        f"<td>{p['ttft_ms']:.3g}</td><td>{p['ttit_ms']:.3g}</td><td>{p['tokens_per_s']:.1f}</td>"
        f"<td>{_esc(p['decode']['summary'])}</td></tr>" for name, p in rows)
    skipped = "".join(f"<li>{_esc(x)}</li>" for x in plan.get("skipped", []))
    return (f'<h2>What-if: {_esc(plan.get("model"))} on {_esc(plan.get("hardware"))} (predicted)</h2>'
            f'<table id="whatif"><tr><th>alternative</th><th>layout</th><th>TTFT ms</th><th>TTIT ms</th>'
            f'<th>tokens/s</th><th>decode summary</th></tr>{body}</table>'
            + (f"<p>Skipped:</p><ul>{skipped}</ul>" if skipped else ""))


def _compared(by_label: dict[str, dict]) -> str:
    """The header of a comparison page: every backend (or run) and where it was read."""
    if len(by_label) < 2:
        return ""
    return "compared: " + ", ".join(f"{lb} ({res['source']['path']})" for lb, res in by_label.items())


def _read_as(src: dict) -> str:
    formats = src.get("formats") or {}
    return ("; read as " + ", ".join(f"{f} ({n})" for f, n in formats.items())) if formats else ""


def render_html(result: dict, by_backend: dict[str, dict] | None = None, plan: dict | None = None,
                comparisons: dict[str, dict] | None = None, hang: dict | None = None) -> str:
    """`by_backend`: analyses per backend of one run (a multi-backend bundle) or of two runs
    (`report A B`), for the comparison; `comparisons`: label -> analysis.compare(first, that);
    `plan`: a `commprobe plan --json` result, for the what-if panel; `hang`: the bundle's hang
    diagnosis (analyzers/hang.py), shown first."""
    by_backend = by_backend or {}
    figs = [("breakdown", breakdown_figure(result))]
    if len(by_backend) > 1:
        f = timelines_figure(by_backend, "decode")
        if f is not None:
            figs.append(("timeline-compare-decode", f))
    for phase in result["phases"]:
        f = timeline_figure(result, phase)
        if f is not None:
            figs.append((f"timeline-{phase}", f))
    f = backends_figure(by_backend)
    if f is not None:
        figs.append(("backends", f))
    elif result["message_sizes"]:
        figs.append(("sizes", sizes_figure(result)))
    figs += traffic_figures(result)
    f = telemetry_figure(result)
    if f is not None:
        figs.append(("telemetry", f))
    verdicts = "".join(
        f'<li class="{_verdict_class(p["verdict"])}"><b>{_esc(ph)}</b>: {_esc(p["summary"])}'
        + ("<ul>" + "".join(f"<li>{_esc(r)}</li>" for r in p["recommendations"]) + "</ul>" if p["recommendations"] else "")
        + "</li>" for ph, p in result["phases"].items())
    unknown = "".join(f"<tr><td>{_esc(u['name'])}</td><td>{u['count']}</td></tr>" for u in result["unclassified"]["names"][:20])
    notes = "".join(f"<li>{_esc(n)}</li>" for p in result["phases"].values() for n in p.get("notes", []))
    prov = "".join(f"<tr><td>{_esc(cat)}</td>" + "".join(f"<td>{src.get(k, 0)}</td>" for k in ("declared", "inferred", "unknown"))
                   + "</tr>" for cat, src in (result.get("axis_provenance") or {}).items())
    links = result.get("kernel_links") or {}
    link_line = (f"<p>Communication kernels linked to the host op that launched them: {links.get('linked', 0)} of "
                 f"{links.get('comm_kernels', 0)} (no launch in the trace: {links.get('no_launch', 0)}; launched outside "
                 f"any host collective: {links.get('outside_host_op', 0)}).</p>" if links.get("comm_kernels") else "")
    manifest = result.get("manifest") or {}
    man_rows = "".join(f"<tr><th>{_esc(k)}</th><td><code>{_esc(json.dumps(v) if isinstance(v, (dict, list)) else v)}</code></td></tr>"
                       for k, v in manifest.items())
    divs = "".join(f'<div id="fig-{name}" class="fig"></div>' for name, _ in figs)
    specs = [(name, json.loads(fig.to_json())) for name, fig in figs]
    plots = "".join(f'Plotly.newPlot("fig-{name}", {_script_json(d["data"])}, {_script_json(d["layout"])}, '
                    f'{{responsive: true}});' for name, d in specs)
    src = result["source"]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>commprobe report: {_esc(src['path'])}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}} .communication{{color:#b00}}
.host{{color:#a60}} .data{{color:#a60}} .imbalance{{color:#80a}} .compute{{color:#060}} table{{border-collapse:collapse}} td,th{{border:1px solid #ccc;padding:2px 6px;text-align:left}}
code{{font-size:85%}}</style>
<script>{get_plotlyjs()}</script></head><body>
<h1>commprobe report</h1>
{hang_section(hang)}
<p>{_esc(_compared(by_backend) or src['path'])}: {len(src['files'])} rank trace(s){' each' if len(by_backend) > 1 else ''}, {src['uncompressed_bytes'] / 1e6:.1f} MB analyzed;
threshold {result['threshold']:.0%}{_esc(_read_as(src))}.</p>
{comparison_section(by_backend, comparisons or {}) if len(by_backend) > 1 else ''}
{''.join(f'<p class="host">note: {_esc(n)}</p>' for n in src.get('reader_notes', ()))}
<h2>Verdict{_esc(f" ({next(iter(by_backend))})") if len(by_backend) > 1 else ''}</h2><ul id="verdicts">{verdicts}</ul>
{f'<ul id="notes">{notes}</ul>' if notes else ''}
{cause_section(result)}
{traffic_section(result)}
{headroom_section(result)}
{engine_phases_section(result)}
<h2>How each axis was decided</h2>
<p>declared: our spans or a process group that names its axis; inferred: from the op (allreduce: TP,
all-to-all: EP; a collective in a gradient hook: DP); unknown: nothing says (p2p send/recv, unnamed groups).</p>
<table id="provenance"><tr><th>category</th><th>declared</th><th>inferred</th><th>unknown</th></tr>{prov}</table>
{link_line}
{divs}
{plan_panel(plan)}
<h2>Unclassified events ({result['unclassified']['count']})</h2><table id="unclassified">{unknown}</table>
<h2>Run manifest</h2><table id="manifest">{man_rows or '<tr><td>(not a commprobe bundle)</td></tr>'}</table>
<script>{plots}</script>
</body></html>
"""


def render_hang_page(hang: dict) -> str:
    """A run that hung before writing any trace: its findings alone, on a page of the same look."""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>commprobe report: {_esc(hang['source'])}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}} .communication{{color:#b00}}
table{{border-collapse:collapse}} td,th{{border:1px solid #ccc;padding:2px 6px;text-align:left}}</style></head><body>
<h1>commprobe report</h1><p>{_esc(hang['source'])}: no trace was written (the run did not finish).</p>
{hang_section(hang)}
</body></html>
"""
