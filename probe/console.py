"""The CLI's consoles and its one way to fail: one line on stderr and an exit status."""

from __future__ import annotations

import sys
from typing import NoReturn

import typer

from commprobe.common.errors import one_line


class _LazyConsole:
    """rich's Console, made on first use: importing rich costs ~30-50 ms that a `--json` run
    never needs (start-up is most of a small analysis)."""

    def __init__(self, **kwargs):
        self._kwargs, self._real = kwargs, None

    def real(self):
        """The Console itself, for rich objects that take one (Progress)."""
        if self._real is None:
            from rich.console import Console

            self._real = Console(**self._kwargs)
        return self._real

    def __getattr__(self, name: str):
        return getattr(self.real(), name)


def _width() -> int | None:
    """COLUMNS where set (a pipe or a test asks for a width), else the terminal's, else 120."""
    import os

    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and 20 <= int(cols) <= 1000:
        return int(cols)
    return None if sys.stdout.isatty() else 120


console = _LazyConsole(width=_width())
err = _LazyConsole(stderr=True)


def fail(msg: str, code: int = 2) -> NoReturn:
    err.print(f"commprobe: error: {one_line(str(msg))}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def say(line: str, *, to_err: bool = False) -> None:
    (err if to_err else console).print(line, highlight=False, markup=False)


def check_cores(world: int, oversubscribe: bool) -> None:
    """More ranks than usable cores livelock spinning waits and distort times: refuse unless asked."""
    from commprobe.common.host import usable_cores

    if world > usable_cores() and not oversubscribe:
        fail(f"world size {world} exceeds the {usable_cores()} CPU cores here; pass --oversubscribe to run anyway")
