"""The CLI's consoles and its one way to fail: one line on stderr and an exit status."""

from __future__ import annotations

import sys
from typing import NoReturn

import typer
from rich.console import Console

console = Console(width=None if sys.stdout.isatty() else 120)
err = Console(stderr=True)


def fail(msg: str, code: int = 2) -> NoReturn:
    err.print(f"commprobe: error: {msg}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def say(line: str, *, to_err: bool = False) -> None:
    (err if to_err else console).print(line, highlight=False, markup=False)


def check_cores(world: int, oversubscribe: bool) -> None:
    """More ranks than usable cores livelock spinning waits and distort times: refuse unless asked."""
    from commprobe.common.host import usable_cores

    if world > usable_cores() and not oversubscribe:
        fail(f"world size {world} exceeds the {usable_cores()} CPU cores here; pass --oversubscribe to run anyway")
