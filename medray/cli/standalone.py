"""One `medray` command as a script of its own (jobs/*.py, tune/sweep.py): the same options,
checks, console and exit statuses as the command."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer


def run_alone(command: Callable[..., Any], prog_name: str,
              argv: list[str] | None = None) -> None:
    """Parse `argv` (default sys.argv) as `command`'s options and run it; exits."""
    app = typer.Typer(rich_markup_mode=None, add_completion=False, pretty_exceptions_enable=False)
    app.command()(command)
    app(args=argv, prog_name=prog_name)
