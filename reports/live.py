"""`commprobe hang --live`: the state of a running job first, then each rank's progress and where
it is (analyzers/hang_live.py computes it; this renders it)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

STATE = {"hang": "[bold red]hang[/]", "straggler": "[bold yellow]straggler[/]", "running": "[green]running[/]", "quiet": "[green]quiet[/]", "busy": "[yellow]busy[/]",
         "unknown": "[yellow]unknown[/]"}


def render_live(result: dict, console: Console) -> None:
    f = result["findings"][0] if result["findings"] else None
    head = f": {escape(f['summary'])}" if f else (": no finding, counts move on every rank"
                                                   if result["state"] == "running" else "")
    console.print(f"{STATE.get(result['state'], escape(result['state']))}{head}", highlight=False)
    console.print(f"[bold]commprobe hang --live[/]: {escape(result['target'])}, {result['polls']} polls over "
                  f"{result['interval_s']:g} s; ranks answering {', '.join(map(str, result['ranks'])) or 'none'}",
                  highlight=False)
    t = Table(show_header=True, header_style="bold", box=None)
    for col in ("rank", "group: last enqueued / completed", "where (file:line in function)"):
        t.add_column(col)
    for r in result["ranks"]:
        prog = "; ".join(f"{escape(pg or 'default')}: {c[0] if c[0] is not None else '?'} / "
                         f"{c[1] if c[1] is not None else '?'}" for pg, c in result["progress"].get(str(r), {}).items())
        t.add_row(str(r), prog or "–", escape(result["stacks"].get(str(r)) or "?"))
    for r, why in result["unanswered"].items():
        t.add_row(r, "[red]no answer[/]", escape(why))
    console.print(t)
    for extra in result["findings"][1:]:
        console.print(f"[bold]also ({escape(extra['kind'])})[/]: {escape(extra['summary'])}", highlight=False)
    for n in result.get("notes", ()):
        console.print(f"[yellow]note:[/] {escape(n)}", highlight=False)
