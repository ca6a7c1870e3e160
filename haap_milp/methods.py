"""Planning methods (solvers), declared once: name -> module, kind, warm start, description.

The planner's orchestrator, the CLI (``--solver`` help and validation), the ``SolverName`` of the specs
and the benchmark grid all read this table. It imports nothing from haap_milp, so the specs can use
it; ``haap_milp.solvers`` turns it into the lazily imported solve functions.

A new method = its solver module (``solve(problem, options=None, hint=None) -> RawResult``, importing
only ``haap_milp.problem``, ``haap_milp.specs`` and ``haap_milp.solvers.common``) + one ``Method`` line
below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["exact", "heuristic", "oracle"]


@dataclass(frozen=True)
class Method:
    """One planning method.

    ``exact``: proves a bound, warm-started from the best heuristic plan (``takes_hint``), run per time
    limit in benchmarks; ``heuristic``: fast, runs first and offers its plan as the warm start;
    ``oracle``: a reference for tests (exhaustive), not offered in the CLI help nor in benchmarks.
    """

    name: str
    module: str
    kind: Kind
    takes_hint: bool
    description: str

    @property
    def listed(self) -> bool:
        """Offered in the CLI help, ``compare`` and the benchmark grid."""
        return self.kind != "oracle"


# order: the order of SolverName (error messages, JSON schema), of the CLI help, compare and bench tables
METHODS: dict[str, Method] = {m.name: m for m in (
    Method("cpsat", "haap_milp.solvers.cpsat", "exact", True, "CP-SAT (OR-Tools) on the exact model"),
    Method("milp", "haap_milp.solvers.milp", "exact", True, "MILP (HiGHS) on the exact model"),
    Method("dp", "haap_milp.solvers.dp", "heuristic", False, "dynamic-programming heuristic"),
    Method("brute", "haap_milp.solvers.brute", "oracle", False, "exhaustive search (tiny problems, tests)"),
    Method("uniform", "haap_milp.solvers.uniform", "heuristic", False, "uniform Megatron-style baseline"),
)}
AUTO = "cpsat"  # what solver "auto" means
METHOD_NAMES: tuple[str, ...] = tuple(METHODS)
SOLVER_NAMES: tuple[str, ...] = ("auto", *METHOD_NAMES)  # for Literal[SOLVER_NAMES]
LISTED: tuple[str, ...] = tuple(n for n, m in METHODS.items() if m.listed)  # cpsat, milp, dp, uniform
EXACT: tuple[str, ...] = tuple(n for n, m in METHODS.items() if m.kind == "exact")
HEURISTICS: tuple[str, ...] = tuple(n for n, m in METHODS.items() if m.kind == "heuristic")


def resolve(name: str) -> str:
    """The method a solver name runs ("auto" means cpsat)."""
    return AUTO if name == "auto" else name


__all__ = ["AUTO", "EXACT", "HEURISTICS", "LISTED", "METHODS", "METHOD_NAMES", "SOLVER_NAMES", "Method", "resolve"]
