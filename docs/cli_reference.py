"""The click commands typer builds from commprobe's CLI, for mkdocs-click (docs/hooks.py puts this
folder on the import path): one attribute per command, so each command's page shows its own options
straight from the code."""

import typer.main

from commprobe.probe.cli import app

commprobe = typer.main.get_command(app)
globals().update({name.replace("-", "_"): cmd for name, cmd in commprobe.commands.items()})
