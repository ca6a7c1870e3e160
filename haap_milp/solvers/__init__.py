"""Solver entry points: ``SOLVERS[name](problem, options, hint=None) -> RawResult``.

The table of methods lives in ``haap_milp.methods`` (one line per solver); this module turns it into
solve functions. Modules are imported on first use (OR-Tools and HiGHS load only when asked for). Each
solver module imports only ``haap_milp.problem``, ``haap_milp.specs`` and ``haap_milp.solvers.common``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from haap_milp.errors import HaapInputError
from haap_milp.methods import METHODS, resolve


def _lazy(module: str) -> Callable:
    def solve(problem, options=None, hint=None):
        return importlib.import_module(module).solve(problem, options, hint)

    solve.__name__ = f"{module.rsplit('.', 1)[-1]}_solve"
    solve.__doc__ = f"Lazy entry point of {module}.solve."
    return solve


SOLVERS: dict[str, Callable] = {name: _lazy(m.module) for name, m in METHODS.items()}


def get_solver(name: str) -> Callable:
    """The solve function of a solver name ("auto" means cpsat)."""
    key = resolve(name)
    if key not in SOLVERS:
        raise HaapInputError(f"Unknown solver {name!r} (field 'solver'); choose one of {', '.join(sorted(SOLVERS))}.")
    return SOLVERS[key]


__all__ = ["SOLVERS", "get_solver"]
