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


@pytest.fixture(scope="session", autouse=True)
def _click_command_built_once():
    """Typer's ``app(...)`` builds the click command anew on each call (``typer.main.get_command``, a pure function of
    the registered app: about 90 ms, 95 % of a refused input's cost in-process); built once per test process here and
    handed back on each call, the entry point (``haap_milp.cli.main`` -> ``_run`` -> ``app(...)``) otherwise runs as
    it is. (Checked when added: the ~2,280 calls of tests/test_fuzz_inputs.py and test_fuzz_hostile.py give the same
    exit codes and stderr either way, and stdout but for measured times.)"""
    import typer.main

    from haap_milp.cli import command_app

    app, real = command_app(), typer.main.get_command
    built = real(app)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(typer.main, "get_command", lambda typer_app: built if typer_app is app else real(typer_app))
        yield


@pytest.fixture
def run_cli() -> Callable[[list[str]], CliResult]:
    """``code, stdout, stderr = run_cli(["show", "llama3-8b", "--json"])``."""
    return invoke_cli
