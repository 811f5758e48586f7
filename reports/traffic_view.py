"""The all-to-all traffic of an analysis (EP's, or CP's sequence-parallel attention's: phases'
`all_to_all`, cross_rank/traffic.py) in the terminal: one line per phase, and the dispatch matrix
where it is small enough to read."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from commprobe.common.units import human_size
from commprobe.common.vocab import a2a_words

MAX_SHOWN = 8  # ranks of a matrix printed in full; a larger group gets its received bytes only


def traffic_line(phase: str, t: dict) -> str:
    if t["sizes"] != "recorded" or t.get("imbalance") is None:
        return f"{a2a_words(t.get('axis', 'ep'))}, {phase}: {t.get('note') or 'no sizes'}"
    calls = (f"{t['dispatch_calls']} dispatches of {t['sized_calls']} sized calls" if t.get("dispatch_calls")
             else f"{t['sized_calls']} sized calls, no dispatch told apart")
    head = t["finding"] or t.get("note") or (f"busiest receiver {t['imbalance']:.2f}x the mean (under the "
                                             f"{t['rule']['imbalance_at_least']:.2f}x a skew needs)")
    unsized = f"; {t['unsized_calls']} call(s) without sizes left out" if t.get("unsized_calls") else ""
    return f"{a2a_words(t.get('axis', 'ep'))}, {phase}: {head} ({calls}{unsized})"


def render_all_to_all(result: dict, console: Console) -> None:
    for phase, p in result["phases"].items():
        t = p.get("all_to_all")
        if not t:
            continue
        console.print(escape(traffic_line(phase, t)), highlight=False)
        m = t.get("dispatch_matrix") or t.get("matrix")
        if not m or len(m) > MAX_SHOWN:
            continue
        ranks = [str(r) if r is not None else f"g{i}" for i, r in enumerate(t["ranks"])]
        what = "dispatch" if t.get("dispatch_matrix") else "all-to-all"
        tab = Table(title=f"{phase} {what} bytes, row to column", title_justify="left")
        tab.add_column("from \\ to", justify="right")
        for r in ranks:
            tab.add_column(r, justify="right")
        for r, row in zip(ranks, m):
            tab.add_row(r, *(human_size(b) for b in row))
        tab.add_row("received", *(human_size(sum(row[d] for row in m)) for d in range(len(m))), style="bold")
        console.print(tab)
