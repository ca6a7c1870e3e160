"""`haap-solve` entry point. Every user mistake ends as one paragraph and exit code 2."""

from __future__ import annotations

import sys

from pydantic import ValidationError
from typer import Abort as ClickAbort

from haap_milp.cli.app import app
from haap_milp.cli.common import fail
from haap_milp.errors import HaapInputError

try:  # recent typer vendors click; older releases depend on it
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - depends on the installed typer
    from click.exceptions import UsageError

# Command modules register themselves on ``app`` when imported.
from haap_milp.cli import (  # noqa: F401
    bench_cmd,
    economics_cmds,
    estimate_cmd,
    inspect_cmds,
    network_cmd,
    profile_cmd,
    solve_cmds,
    trust_cmds,
)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    args = list(argv if argv is not None else sys.argv[1:])
    if not args:
        args = ["--help"]
    try:
        code = app(args=args, prog_name="haap-solve", standalone_mode=False)
    except HaapInputError as exc:
        fail(str(exc))
    except ValidationError as exc:  # should have been converted at the boundary; still no traceback
        fail(" ".join(str(exc).split()))
    except UsageError as exc:  # unknown option, missing value, bad choice
        cmd = f" {exc.ctx.info_name}" if exc.ctx is not None and exc.ctx.parent is not None else ""
        fail(f"{' '.join(exc.format_message().split())} (see: haap-solve{cmd} --help)")
    except ClickAbort:
        fail("aborted")
    except KeyboardInterrupt:
        code = 130
    if code == 130:  # Ctrl-C outside a solve's own handler (typer turns it into exit code 130): every output is
        # written atomically, so nothing is left half-written; say so instead of exiting without a word
        sys.stderr.write("interrupted: stopped before finishing; files already written are complete, nothing is "
                         "half-written.\n")
    if isinstance(code, int) and code:
        raise SystemExit(code)
