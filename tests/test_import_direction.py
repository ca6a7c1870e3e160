"""The import direction of docs/DESIGN.md: cli -> planner -> solvers -> problem; presolve -> estimator -> specs.
Solvers never import the estimator, presolve or each other's modules (only solvers.common); the
simulator and checker never import solvers or presolve."""

from __future__ import annotations

import ast
import pathlib

PKG = pathlib.Path(__file__).parent.parent / "haap_milp"


def imports(path: pathlib.Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("haap_milp")}


def _files(sub: str) -> list[pathlib.Path]:
    p = PKG / sub
    return sorted(p.rglob("*.py")) if p.is_dir() else [p]


def test_solvers_do_not_import_the_estimator_presolve_or_each_other():
    forbidden = ("haap_milp.estimator", "haap_milp.presolve", "haap_milp.planner", "haap_milp.cli")
    for f in _files("solvers"):
        for m in imports(f):
            assert not m.startswith(forbidden), (f.name, m)
            if m.startswith("haap_milp.solvers.") and f.parent.name != "common":
                own = {"haap_milp.solvers.common", "haap_milp.solvers.dp.core", "haap_milp.solvers.dp.fallback"}
                assert any(m.startswith(x) for x in own), (f.name, m)


def test_judges_are_independent_of_the_solvers():
    for name in ("simulate.py", "check.py"):
        for m in imports(PKG / name):
            assert not m.startswith(("haap_milp.solvers", "haap_milp.presolve", "haap_milp.planner")), (name, m)


def test_lower_layers_do_not_import_upper_ones():
    upper = ("haap_milp.planner", "haap_milp.cli", "haap_milp.solvers", "haap_milp.presolve")
    for f in _files("estimator") + _files("specs") + _files("problem.py") + _files("pipeline.py"):
        for m in imports(f):
            assert not m.startswith(upper), (f.name, m)
    for m in imports(PKG / "problem.py"):
        assert m in ("haap_milp.pipeline",), m  # the solver-facing problem stays plain
