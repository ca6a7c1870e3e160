"""Solver registry: ``SOLVERS[name](problem, options, hint=None) -> RawResult``.

Modules are imported on first use (OR-Tools and HiGHS load only when asked for). Each solver
module imports only ``haap_milp.problem``, ``haap_milp.specs`` and ``haap_milp.solvers.common``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from haap_milp.errors import HaapInputError

_MODULES = {
    "cpsat": "haap_milp.solvers.cpsat",
    "milp": "haap_milp.solvers.milp",
    "dp": "haap_milp.solvers.dp",
    "brute": "haap_milp.solvers.brute",
    "uniform": "haap_milp.solvers.uniform",
}


def _lazy(module: str) -> Callable:
    def solve(problem, options=None, hint=None):
        return importlib.import_module(module).solve(problem, options, hint)

    solve.__name__ = f"{module.rsplit('.', 1)[-1]}_solve"
    solve.__doc__ = f"Lazy entry point of {module}.solve."
    return solve


SOLVERS: dict[str, Callable] = {name: _lazy(mod) for name, mod in _MODULES.items()}


def get_solver(name: str) -> Callable:
    """The solve function of a solver name ("auto" means cpsat)."""
    key = "cpsat" if name == "auto" else name
    if key not in SOLVERS:
        raise HaapInputError(f"Unknown solver {name!r} (field 'solver'); choose one of {', '.join(sorted(SOLVERS))}.")
    return SOLVERS[key]


__all__ = ["SOLVERS", "get_solver"]
