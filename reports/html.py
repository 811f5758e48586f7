"""Self-contained HTML report of an analysis result (plotly.js embedded: opens offline).

It renders what the analyzers computed and computes nothing new. Every string that came from
a trace or a manifest is HTML-escaped where it lands in markup, and figure JSON placed inside a
<script> element has "</" written as "<\\/", so a kernel named `</script><script>…` stays text.
"""

from __future__ import annotations

import html
import json

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

CATS = ("compute", "tp_allreduce", "cp_ring", "ep_all_to_all", "other_comm", "memcpy", "other")
COLORS = {"compute": "#4c78a8", "tp_allreduce": "#e45756", "cp_ring": "#f58518", "ep_all_to_all": "#b279a2",
          "other_comm": "#ff9da6", "memcpy": "#9d755d", "other": "#bab0ac", "straggler wait": "#eeca3b",
          "idle": "#d9d9d9"}


def _esc(x) -> str:
    return html.escape(str(x), quote=True)


def _script_json(obj) -> str:
    return json.dumps(obj).replace("</", "<\\/")


def breakdown_figure(result: dict) -> go.Figure:
    """Stacked exposed time per phase and rank (µs per window), straggler wait split out of comm."""
    fig = go.Figure()
    rows = [(r["rank"], ph, p) for r in result["ranks"] for ph, p in r["phases"].items()]
    labels = [f"{ph} · rank {rank}" for rank, ph, _ in rows]
    waits = {x["rank"]: x for x in result["collectives"]["ranks"]}
    for c in CATS:
        fig.add_bar(name=c, x=labels, y=[p["categories"][c]["exposed_us"] / p["windows"] for _, _, p in rows],
                    marker_color=COLORS[c])
    fig.add_bar(name="idle", x=labels, y=[p["idle_us"] / p["windows"] for _, _, p in rows], marker_color=COLORS["idle"])
    total_wait = {r: w["wait_us"] for r, w in waits.items()}
    fig.update_layout(barmode="stack", title="Exposed time per phase and rank (µs per window)",
                      yaxis_title="µs", legend_title="category", height=420)
    if any(total_wait.values()):
        fig.add_annotation(text="straggler wait (all phases): " + ", ".join(
            f"rank {r}: {v / 1e3:.1f} ms" for r, v in sorted(total_wait.items())), showarrow=False,
            xref="paper", yref="paper", x=0, y=1.08)
    return fig


def sizes_figure(result: dict) -> go.Figure:
    fig = go.Figure()
    for op in sorted({b["op"] for b in result["message_sizes"]}):
        bs = [b for b in result["message_sizes"] if b["op"] == op]
        fig.add_scatter(name=f"{op} latency", x=[b["bucket_bytes"] for b in bs], y=[b["median_us"] for b in bs],
                        mode="lines+markers")
        fig.add_scatter(name=f"{op} busbw", x=[b["bucket_bytes"] for b in bs], y=[b["busbw_GBps"] for b in bs],
                        mode="lines+markers", yaxis="y2", line={"dash": "dot"})
    fig.update_layout(title="Collective latency and busbw by message size", xaxis={"type": "log", "title": "bytes"},
                      yaxis={"type": "log", "title": "median µs"},
                      yaxis2={"type": "log", "title": "busbw GB/s", "overlaying": "y", "side": "right"}, height=420)
    return fig


def render_html(result: dict) -> str:
    figs = [("breakdown", breakdown_figure(result))]
    if result["message_sizes"]:
        figs.append(("sizes", sizes_figure(result)))
    verdicts = "".join(
        f'<li class="{_esc(p["verdict"].split("/")[0].split("-")[0])}"><b>{_esc(ph)}</b>: {_esc(p["summary"])}'
        + ("<ul>" + "".join(f"<li>{_esc(r)}</li>" for r in p["recommendations"]) + "</ul>" if p["recommendations"] else "")
        + "</li>" for ph, p in result["phases"].items())
    unknown = "".join(f"<tr><td>{_esc(u['name'])}</td><td>{u['count']}</td></tr>" for u in result["unclassified"]["names"][:20])
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
.host{{color:#a60}} .compute{{color:#060}} table{{border-collapse:collapse}} td,th{{border:1px solid #ccc;padding:2px 6px;text-align:left}}
code{{font-size:85%}}</style>
<script>{get_plotlyjs()}</script></head><body>
<h1>commprobe report</h1>
<p>{_esc(src['path'])}: {len(src['files'])} rank trace(s), {src['uncompressed_bytes'] / 1e6:.1f} MB analyzed;
threshold {result['threshold']:.0%}.</p>
<h2>Verdict</h2><ul id="verdicts">{verdicts}</ul>
{divs}
<h2>Unclassified events ({result['unclassified']['count']})</h2><table id="unclassified">{unknown}</table>
<h2>Run manifest</h2><table id="manifest">{man_rows or '<tr><td>(not a commprobe bundle)</td></tr>'}</table>
<script>{plots}</script>
</body></html>
"""
