"""The all-to-all traffic of an analysis (EP's, or CP's sequence-parallel attention's) as pictures
for the HTML report: per phase with a sized matrix, a heatmap of bytes per (sender, receiver) pair
and each rank's received bytes as bars."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from commprobe.common.units import human_size
from commprobe.common.vocab import a2a_words


def traffic_figures(result: dict) -> list[tuple[str, go.Figure]]:
    out = []
    for phase, p in result["phases"].items():
        t = p.get("all_to_all") or {}
        m = t.get("dispatch_matrix") or t.get("matrix")
        if not m:
            continue
        labels = [f"rank {r}" if r is not None else f"group rank {i}" for i, r in enumerate(t["ranks"])]
        what = "dispatch" if t.get("dispatch_matrix") else "all-to-all"
        fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.2,
                            subplot_titles=(f"{what} bytes: sender (row) to receiver (column)",
                                            "bytes received per rank"))
        fig.add_trace(go.Heatmap(z=m, x=labels, y=labels, colorscale="Blues", colorbar={"x": 0.52, "len": 0.9, "thickness": 12},
                                 text=[[human_size(b) for b in row] for row in m], texttemplate="%{text}",
                                 hovertemplate="%{y} to %{x}: %{z} bytes<extra></extra>"), row=1, col=1)
        hot = t.get("hot_group_rank")
        fig.add_trace(go.Bar(x=labels, y=t["received"], showlegend=False,
                             marker_color=["#b00" if i == hot and t.get("skew") else "#4a7ab7" for i in range(len(labels))],
                             hovertemplate="%{x}: %{y} bytes<extra></extra>"), row=1, col=2)
        fig.update_yaxes(autorange="reversed", row=1, col=1)
        imb = t.get("imbalance")
        fig.update_layout(title=f"{a2a_words(t.get('axis', 'ep'))}, {phase}: busiest receiver "
                                + (f"{imb:.2f}x the mean" if imb is not None else "n/a"),
                          height=380, margin={"t": 80})
        out.append((f"traffic-{phase}", fig))
    return out


def traffic_section(result: dict) -> str:
    """One line per phase with all-to-all calls (the terminal's words), above the figures."""
    from .sections import esc
    from .traffic_view import traffic_line

    rows = [traffic_line(ph, p["all_to_all"]) for ph, p in result["phases"].items() if p.get("all_to_all")]
    if not rows:
        return ""
    return ('<h2>All-to-all: who sends how much to whom</h2><p>From the split sizes the traces recorded; '
            'the imbalance is the busiest receiver of the dispatches over the mean (a dispatch: a call followed '
            'by its own transpose, the combine).</p><ul id="all-to-all">'
            + "".join(f"<li>{esc(r)}</li>" for r in rows) + "</ul>")
