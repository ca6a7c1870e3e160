"""Shared test fixtures (keep small)."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

# benchmark-only code (benchmarks/measured_runs.py: published runs as specs) is not in the package
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

CliResult = tuple[int, str, str]


def invoke_cli(args: list[str]) -> CliResult:
    """Run `haap-solve ARGS` in-process through the real entry point: (exit code, stdout, stderr)."""
    from haap_milp.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def run_cli() -> Callable[[list[str]], CliResult]:
    """``code, stdout, stderr = run_cli(["show", "llama3-8b", "--json"])``."""
    return invoke_cli
