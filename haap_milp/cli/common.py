"""Shared CLI helpers: consoles, JSON output, the one-paragraph error."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

from rich.console import Console

console = Console()
err_console = Console(stderr=True)


def fail(message: str) -> NoReturn:
    """Print one paragraph to stderr and exit with code 2 (user error)."""
    err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise SystemExit(2)


def print_json(obj: Any) -> None:
    """JSON to stdout, stable key order, no rich markup."""
    sys.stdout.write(json.dumps(obj, indent=2, default=_default) + "\n")


def _default(o: Any) -> Any:
    if hasattr(o, "model_dump"):
        return o.model_dump(mode="json")
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "value"):
        return o.value
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
