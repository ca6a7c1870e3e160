"""The method and target registries drive everything: every registered method and target is exercised
from the registry (a new line there adds its tests here), and a target's capabilities, not its name,
decide which plans presolve offers."""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

from haap_milp import planner, presolve, targets
from haap_milp.bench.spec import METHOD_ORDER, parse_spec
from haap_milp.catalog import load_cluster, load_model
from haap_milp.check import check_plan
from haap_milp.methods import EXACT, LISTED, METHODS, SOLVER_NAMES
from haap_milp.specs import SolveOptions, SolverName, Status, Target, TrainingSpec
from haap_milp.targets import TARGETS, EngineCapabilities

# tiny and heterogeneous (two GPU types, different memory), small enough for brute force
MODEL, CLUSTER = "gpt3-1.3b", "a100-80g:4/4,a100-40g:4/4"
TRAINING = TrainingSpec(global_batch_size=16, seq_len=2048)
OPTS = SolveOptions(time_limit_s=30, threads=1, relative_gap=0.0, max_stages=2, micro_batch_sizes=(4, 8))


@pytest.fixture(scope="module")
def inputs():
    return load_model(MODEL), load_cluster(CLUSTER)


@pytest.fixture(scope="module")
def optimum(inputs):
    """The proven optimum of the tiny instance (brute force, no target restriction)."""
    out = planner.solve(*inputs, TRAINING, OPTS.model_copy(update={"solver": "brute"}))
    assert out.result.status == Status.OPTIMAL, out.result.message
    return out.result.objective_s


@pytest.mark.parametrize("name", METHODS)
def test_every_method_solves_through_the_planner(name, inputs, optimum):
    out = planner.solve(*inputs, TRAINING, OPTS.model_copy(update={"solver": name}))
    r = out.result
    assert r.status in (Status.OPTIMAL, Status.FEASIBLE), (name, r.status, r.message)
    assert r.solver == name and out.violations == []
    assert abs(out.estimate.iteration_time_s - r.objective_s) <= 1e-3 * r.objective_s
    assert r.objective_s >= optimum * (1 - 1e-6)  # no method beats the proven optimum
    if METHODS[name].kind == "exact":  # gap 0 asked: an exact method finds the optimum, warm-started
        assert r.objective_s <= optimum * (1 + 1e-3)
        assert {"dp_objective_s", "uniform_objective_s"} <= set(r.stats)


@pytest.mark.parametrize("name", METHODS)
def test_every_method_is_offered_where_its_kind_says(name, run_cli):
    method = METHODS[name]
    assert name in SolverName.__args__ and importlib.import_module(method.module).solve
    code, out, _ = run_cli(["solve", "--help"])
    assert code == 0 and (f"| {name} " in out or f"| {name}." in out) == method.listed
    if method.listed:
        spec = parse_spec({"models": ["gpt3-1.3b"], "clusters": ["h100-80g:8"], "methods": [name],
                           "time_limits_s": [5, 10]})
        assert spec.runs() == ([(name, 5.0), (name, 10.0)] if name in EXACT else [(name, None)])
    else:
        with pytest.raises(Exception, match="methods"):
            parse_spec({"models": ["gpt3-1.3b"], "clusters": ["h100-80g:8"], "methods": [name]})


def test_bench_runs_heuristics_before_the_exact_methods():
    assert set(METHOD_ORDER) == set(LISTED)
    kinds = [METHODS[m].kind for m in METHOD_ORDER]
    assert kinds == sorted(kinds, key=lambda k: k == "exact")


@pytest.mark.parametrize("name", TARGETS)
def test_every_target_gives_plans_its_engine_accepts(name, inputs):
    caps = TARGETS[name]
    assert name in Target.__args__
    if name == "torchtitan":  # torchtitan builds only its registry models: llama3 8B is the smallest in the catalog
        inputs = (load_model("llama3-8b"), inputs[1])
    out = planner.solve(*inputs, TRAINING, OPTS.model_copy(update={"solver": "dp", "target": name}))
    plan = out.result.plan
    assert out.result.status == Status.FEASIBLE and plan is not None, out.result.message
    assert check_plan(plan, *inputs, TRAINING, target=name) == []
    if caps.uniform_stages:
        assert plan.is_uniform
    if caps.module is not None:  # the emitter declares the registry's capabilities and writes files
        from haap_milp.emit import emit

        mod = importlib.import_module(caps.module)
        assert mod.CAPABILITIES is caps
        assert emit(plan, name, inputs[1], inputs[0], TRAINING)


def _fake(monkeypatch, **caps) -> str:
    monkeypatch.setitem(TARGETS, "fake", EngineCapabilities("fake", None, "test engine", **caps))
    return "fake"


def _presolve(inputs, target: str, model=None):
    opts = OPTS.model_copy(update={"target": target})  # model_copy skips validation: "fake" is not a Target
    return presolve.build(model or inputs[0], inputs[1], TRAINING, opts)


def _best_plan(inputs, target: str, model=None):
    ctx = planner.Context.build(model or inputs[0], inputs[1], TRAINING, OPTS.model_copy(
        update={"target": target, "solver": "brute"}))
    return planner.orchestrate(ctx, [("brute", None)]).outcomes[0].result.plan


def test_uniform_capability_gives_only_uniform_plans(monkeypatch, inputs):
    # gpt3-2.7b: the unrestricted optimum mixes stages (tp 2 x dp 2 | tp 1 x dp 4); gpt3-1.3b's is uniform since the
    # issue-12 third refit
    m = load_model("gpt3-2.7b")
    assert not _best_plan(inputs, "any", m).is_uniform
    fake = _fake(monkeypatch, uniform_stages=True)
    assert _presolve(inputs, fake, m).problem.uniform
    assert _best_plan(inputs, fake, m).is_uniform


def test_recompute_capability_limits_the_options(monkeypatch, inputs):
    fake = _fake(monkeypatch, recompute_modes=("full",))
    modes = {o.recompute for o in _presolve(inputs, fake).problem.options}
    assert modes == {"full"} != {o.recompute for o in _presolve(inputs, "any").problem.options}


def test_tied_embedding_capabilities(monkeypatch, inputs):
    tied = inputs[0].model_copy(update={"tied_embeddings": True})
    free = _presolve(inputs, "any", tied).problem
    assert free.max_stages > 1 and not free.same_tp_first_last
    fake = _fake(monkeypatch, max_stages_when_tied=1, same_tp_first_last_when_tied=True)
    prob = _presolve(inputs, fake, tied).problem
    assert prob.max_stages == 1 and prob.same_tp_first_last
    untied = _presolve(inputs, fake, inputs[0].model_copy(update={"tied_embeddings": False})).problem
    assert untied.max_stages == free.max_stages and not untied.same_tp_first_last


def test_unknown_target_is_one_paragraph():
    with pytest.raises(targets.HaapInputError, match="unknown target 'nope'; use one of any, megatron"):
        targets.capabilities("nope")


def test_registries_have_no_strays():
    assert SOLVER_NAMES == ("auto", *METHODS) and set(Target.__args__) == set(TARGETS)
    assert all(m.kind in ("exact", "heuristic", "oracle") for m in METHODS.values())
    assert all(METHODS[m].takes_hint for m in EXACT)


# --------------------------------------------------------------------------- import graph

PKG = pathlib.Path(__file__).parent.parent / "haap_milp"
KNOWN_CYCLES: list[set[str]] = []  # none: every import, function-level and TYPE_CHECKING ones included


def _import_graph() -> dict[str, set[str]]:
    """Module -> haap_milp modules it imports, at module level or inside functions."""
    def name(p: pathlib.Path) -> str:
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    files = {name(p): p for p in PKG.rglob("*.py")}
    graph = {}
    for mod, path in files.items():
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                out.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                           for a in node.names)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
        graph[mod] = {m for m in out if m in files and m != mod}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while not comp or v not in comp:
                comp.add(stack.pop())
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    graph = _import_graph()
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [{"a", "b"}]  # the detector sees a cycle
    assert all(c in KNOWN_CYCLES for c in _cycles(graph)), _cycles(graph)


def test_registries_import_nothing_above_them():
    graph = _import_graph()
    for registry in ("haap_milp.targets", "haap_milp.methods"):
        assert graph[registry] <= {"haap_milp.errors"}, (registry, graph[registry])
    for name, caps in TARGETS.items():  # the emitters import the registry, never the package that dispatches
        if caps.module is not None:
            assert "haap_milp.targets" in graph[caps.module] and "haap_milp.emit" not in graph[caps.module], name
