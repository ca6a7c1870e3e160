"""`haap-solve` entry point. Every user mistake ends as one paragraph and exit code 2."""

from __future__ import annotations

import sys

from pydantic import ValidationError

from haap_milp.cli.app import app
from haap_milp.cli.common import fail
from haap_milp.errors import HaapInputError

# Command modules register themselves on ``app`` when imported.
from haap_milp.cli import inspect_cmds, estimate_cmd, solve_cmds, trust_cmds, bench_cmd  # noqa: E402,F401


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        app(args=argv if argv is not None else sys.argv[1:], prog_name="haap-solve")
    except HaapInputError as exc:
        fail(str(exc))
    except ValidationError as exc:  # should have been converted at the boundary; still no traceback
        fail(" ".join(str(exc).split()))
