r"""The Typer application every command registers on, and how a user error ends a command
(:class:`CLIError`, :func:`_fail`: one line on stderr, exit status 2)."""

from __future__ import annotations

import sys
from typing import NoReturn

import typer

app = typer.Typer(
    name="bo-online",
    help=(
        "Bayesian optimisation, active learning and streaming regression with online GP "
        "surrogates. Every run writes records.jsonl (one line per step), checkpoint.pt (resume "
        "with `bo-online resume`), config.json and plots/*.png into its --out directory."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def _fail(message: str, code: int = 2) -> NoReturn:
    """Print ``message`` as one line on stderr and exit with ``code``."""
    line = " ".join(str(message).split())
    print(f"bo-online: error: {line}", file=sys.stderr)
    raise SystemExit(code)
