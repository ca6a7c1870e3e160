"""`haap-solve` entry point. Every user mistake ends as one paragraph and exit code 2.

This module imports nothing heavy: the console script imports ``main`` from here, and ``main`` imports typer,
pydantic and the command modules (about 0.5 s) inside its Ctrl-C guard, so a Ctrl-C during start-up ends like one
later (one line, exit code 130), not in a traceback through the imports.
"""

from __future__ import annotations

import sys

AGAIN_S = 0.01  # s after a lost Ctrl-C (``_raise_lost_interrupts``) that it is sent again
INTERRUPTED = ("interrupted: stopped before finishing; files already written are complete, nothing is "
               "half-written.\n")


def command_app():
    """The typer app with every command registered (command modules register themselves on ``app`` when
    imported)."""
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
    from haap_milp.cli.typer_app import app

    globals()["app"] = app  # (cached; the Typer app lives in ``typer_app``, so no submodule import binds the name)
    return app


def __getattr__(name: str):
    """``from haap_milp.cli import app``: the app with its commands, imported on first use (PEP 562)."""
    if name == "app":
        return command_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    args = list(argv if argv is not None else sys.argv[1:])
    _raise_lost_interrupts()
    try:
        code = _run(args or ["--help"])
    except KeyboardInterrupt:  # Ctrl-C during start-up, or outside a command's own handler
        code = 130
    if code == 130:  # (typer turns a Ctrl-C inside a command into exit code 130): every output is written
        # atomically, so nothing is left half-written; say so instead of exiting without a word
        sys.stderr.write(INTERRUPTED)
    if isinstance(code, int) and code:
        raise SystemExit(code)


def _raise_lost_interrupts() -> None:
    """A Ctrl-C that lands in a callback Python cannot raise from (during start-up: the import lock's weakref callback)
    is printed by ``sys.unraisablehook`` as "Exception ignored in ... Traceback ... KeyboardInterrupt" and then lost, so
    the command ran on (seen once in ~4,000 unseeded fuzz cases). Here it is sent again AGAIN_S later, where Python can
    raise it (SIGINT to this process, whatever handles it), so it ends as any Ctrl-C does: one line, exit code 130.
    Installed once per process (``main`` may run many times in one)."""
    import os
    import signal
    import threading

    previous = sys.unraisablehook
    if getattr(previous, "haap_lost_interrupts", False):
        return

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
            # (from another thread, a moment later: sent from here, the handler would raise inside this hook)
            again = threading.Timer(AGAIN_S, os.kill, (os.getpid(), signal.SIGINT))
            again.daemon = True
            again.start()
            return
        previous(unraisable)

    hook.haap_lost_interrupts = True
    sys.unraisablehook = hook


def _run(args: list[str]):
    """The command's exit code; a user mistake ends in ``fail`` (one paragraph, exit code 2)."""
    from pydantic import ValidationError
    from typer import Abort as ClickAbort

    from haap_milp.cli.common import fail
    from haap_milp.errors import HaapInputError

    try:  # recent typer vendors click; older releases depend on it
        from typer._click.exceptions import UsageError
    except ImportError:  # pragma: no cover - depends on the installed typer
        from click.exceptions import UsageError

    app = command_app()
    try:
        return app(args=args, prog_name="haap-solve", standalone_mode=False)
    except HaapInputError as exc:
        fail(str(exc))
    except ValidationError as exc:  # should have been converted at the boundary; still no traceback
        fail(" ".join(str(exc).split()))
    except UsageError as exc:  # unknown option, missing value, bad choice
        cmd = f" {exc.ctx.info_name}" if exc.ctx is not None and exc.ctx.parent is not None else ""
        fail(f"{' '.join(exc.format_message().split())} (see: haap-solve{cmd} --help)")
    except ClickAbort:
        fail("aborted")
