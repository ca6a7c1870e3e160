"""The typer application; command modules register on it (parsing and printing only)."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="haap-solve",
    help="Plan LLM training on heterogeneous GPU clusters: exact CP-SAT/MILP plans, estimates, comparisons.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
