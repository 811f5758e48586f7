"""Render planner results (plan.costmodel.Prediction) in the terminal. Computes nothing."""

from __future__ import annotations


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def render_prediction(p, title: str, console) -> None:
    from rich.table import Table

    t = Table(title=title)
    for col in ("phase", "latency ms", "compute ms", "overhead ms", "exposed TP", "exposed CP", "exposed EP", "summary"):
        t.add_column(col, justify="left" if col in ("phase", "summary") else "right")
    for name, ph in (("prefill (TTFT)", p.prefill), ("decode (TTIT)", p.decode)):
        sh = ph.exposed_share
        t.add_row(name, f"{ph.total_us / 1e3:.3g}", f"{ph.compute_us / 1e3:.3g}", f"{ph.overhead_us / 1e3:.3g}",
                  _pct(sh["tp"]), _pct(sh["cp"]), _pct(sh["ep"]), ph.summary())
    console.print(t)
    extra = f", CP prefill variant {p.prefill.cp_variant}" if p.prefill.cp_variant else ""
    console.print(f"{p.hosts} host(s), {p.layout.world} devices; {p.tokens_per_s:.1f} tokens/s at batch {p.batch}{extra}",
                  highlight=False)


def render_whatif(rows, skipped, sort: str, console) -> None:
    from rich.table import Table

    key = (lambda r: r[1].ttft_ms) if sort == "ttft" else (lambda r: r[1].ttit_ms)
    t = Table(title=f"What-if, sorted by {sort.upper()}")
    for col in ("alternative", "layout", "TTFT ms", "TTIT ms", "tokens/s", "decode exposed", "decode summary"):
        t.add_column(col, justify="left" if col in ("alternative", "layout", "decode summary") else "right")
    for name, p in sorted(rows, key=key):
        lay = f"TP{p.layout.tp} CP{p.layout.cp} EP{p.layout.ep}"
        t.add_row(name, lay, f"{p.ttft_ms:.3g}", f"{p.ttit_ms:.3g}", f"{p.tokens_per_s:.1f}",
                  _pct(sum(p.decode.exposed_share.values())), p.decode.summary())
    console.print(t)
    for s in skipped:
        console.print(f"  skipped {s}", highlight=False, markup=False)
