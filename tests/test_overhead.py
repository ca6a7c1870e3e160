"""Issue 11, fixed costs: caches that must not change a result, and the start-up import of CP-SAT."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
from synthetic import random_problem

from haap_milp.solvers.common import slot_bounds
from haap_milp.solvers.common.slot_bounds import build_tables


def _tables_equal(a, b) -> None:
    for name in ("v", "M", "L", "K", "p_min", "p_max"):
        assert getattr(a, name) == getattr(b, name), name
    for name in ("opts", "group", "use", "tp", "sig", "U", "Uf", "U_mem", "Uf_mem", "lo", "lof", "dom", "p2p"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    for key in a.coef:
        assert np.array_equal(a.coef[key], b.coef[key]), key


def test_memory_part_is_shared_by_a_restricted_problem_and_equals_a_fresh_build():
    """The planner's ``_restrict`` keeps every field but the variants: the restricted problem's tables reuse the
    memory part of the same variant objects (one build, not two) and equal tables built from nothing."""
    p = random_problem(7, num_groups=2, num_variants=3)
    keep = [1, 2]
    sub = replace(p, variants=tuple(p.variants[i] for i in keep))
    for j, v in enumerate(keep):
        full = build_tables(p, v)
        t = build_tables(sub, j)
        assert t.v == j and full.v == v  # the index in its own problem, not the cached one's
        assert t.U_mem is full.U_mem  # shared, not rebuilt
        slot_bounds._MEMO.__dict__.clear()
        _tables_equal(t, build_tables(sub, j))  # a fresh build gives the same tables


def test_a_problem_with_another_field_does_not_share_the_memory_part():
    """Any other field changed (here the layer count): the cache is dropped, the tables are the new problem's."""
    p = random_problem(3, num_groups=2)
    a = build_tables(p, 0)
    q = replace(p, num_layers=p.num_layers - 1)
    b = build_tables(q, 0)
    assert b.L == p.num_layers - 1 and b.U_mem is not a.U_mem


def test_cpsat_import_leaves_pandas_unimported_and_usable():
    """ortools' cp_model is imported without pandas (start-up); pandas, imported later, is the real one and
    cp_model's pandas helpers still work with it."""
    code = ("import sys\n"
            "import haap_milp.solvers.cpsat as c\n"
            "assert 'pandas' not in sys.modules\n"
            "m = c.cp_model.CpModel(); x = m.new_int_var(0, 3, 'x'); m.add(x >= 2); m.minimize(x)\n"
            "s = c.cp_model.CpSolver(); assert s.solve(m) == c.cp_model.OPTIMAL and s.value(x) == 2\n"
            "import pandas as pd\n"
            "assert type(m.new_int_var_series('y', pd.Index([1, 2]), 0, 3)) is pd.Series\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_builtin_catalog_files_parse_the_same_with_libyaml_and_pure_python():
    """The built-in catalog is parsed by libyaml (start-up): the same data as PyYAML's pure-Python SafeLoader."""
    import yaml

    from haap_milp.catalog.data import builtin_yaml

    for name in ("gpus.yaml", "models.yaml", "clusters.yaml", "prices.yaml"):
        fast, slow = builtin_yaml(name), builtin_yaml(name, loader=yaml.SafeLoader)
        assert fast == slow and repr(fast) == repr(slow), name


def test_an_expired_deadline_skips_the_exact_search_and_keeps_the_heuristic_plan_with_the_b1_gap():
    """Deadline past before the heuristics (e.g. start-up and presolve took it all): the DP stops at its first plan
    (``stopped``), the exact search is not started (``exact_skipped``), and the plan is checked and carries the
    presolve's eq. B1 bound as its proven gap. Asserts on what the deadline code decides, not on timing."""
    from haap_milp import planner
    from haap_milp.catalog import load_cluster, load_model
    from haap_milp.deadline import Deadline, use
    from haap_milp.specs import SolveOptions, Status, TrainingSpec

    training = TrainingSpec(global_batch_size=256, seq_len=4096)
    opts = SolveOptions(time_limit_s=60, threads=1)
    ctx = planner.Context.build(load_model("llama3-8b"), load_cluster("a100-80g:16,a100-40g:16"), training, opts)
    dl = Deadline(0.0)
    with use(dl):
        done = planner.orchestrate(ctx, [("cpsat", None)], deadline=dl)
    out, dp = done.outcomes[0], done.heuristics["dp"]
    r = out.result
    assert len(ctx.presolved.problem.variants) > 1 and dp.stats.get("stopped") == "deadline"
    assert r.plan is not None and not out.violations and r.stats.get("exact_skipped") == 1
    assert r.status in (Status.FEASIBLE, Status.OPTIMAL) and r.bound_s == ctx.presolved.lower_bound_s
    assert r.gap is not None and 0 <= r.gap < 1 and r.objective_s == min(
        h.objective_s for h in done.heuristics.values() if h.objective_s is not None)


def test_solve_with_a_tiny_time_limit_returns_a_plan_and_its_gap(tmp_path):
    """`haap-solve solve --time-limit 0.01` (in-process: the limit counts from the call): exit 0, a checked plan
    in the JSON with a proven gap, the exact search skipped."""
    import json

    from conftest import invoke_cli

    out = tmp_path / "plan.json"
    code, _, err = invoke_cli(["solve", "-m", "llama3-8b", "-c", "a100-80g:16,a100-40g:16", "--gbs", "256",
                               "--time-limit", "0.01", "--json", str(out)])
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["plan"] and doc["status"] in ("FEASIBLE", "OPTIMAL") and doc["gap"] is not None
    assert doc["stats"]["exact_skipped"] == 1
