"""Eq. N9b (islands apart as branches, dominated islands left out) against brute force.

The instances are random problems copied onto a second island: the copy's options are the originals' twins with
every time term scaled by a factor >= 1 (a slower NIC), so island "a" dominates island "b"; the link between the
islands is slow, so that in most nodes no plan crosses it. Checked: ``dominates`` is right in both directions and
fails when one twin is made cheaper than its original; every plan inside "b" has its twin inside "a", feasible and no
slower (``evaluate`` and ``violations``, the model's own definitions, not the module's argument); and the exact
solvers, which leave island "b" out, still return brute force's optimum with a bound at or below it."""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import assert_exact_solvers_match_brute, feasible_assignments, random_problem

from haap_milp.problem import Assignment, Option, Problem, Stage, evaluate, violations
from haap_milp.solvers import get_solver
from haap_milp.solvers.common import island_split
from haap_milp.specs import SolveOptions

EXACT = SolveOptions(time_limit_s=20, relative_gap=0.0, threads=1, seed=0)
TIME_FIELDS = ("layer_time", "first_time", "last_time", "sync_fixed", "sync_per_layer", "sync_first", "sync_last")


def mirrored(seed: int, slow: float = 1.3, cross_s: float = 5.0, equal: bool = False, **shape) -> Problem:
    """A random two-group problem on island "a", copied onto island "b" (every time term x ``slow``, links inside "b"
    x ``slow``; ``equal``: an exact copy); links between the islands take ``cross_s`` seconds. ``shape``: more
    arguments of ``random_problem`` (layers, stages, options)."""
    base = random_problem(seed, **({"num_groups": 2, "max_options": 4, "uniform": False, "same_tp_first_last": False}
                                   | shape))
    G = len(base.groups)
    f = 1.0 if equal else slow
    options = base.options + tuple(dataclasses.replace(o, group=o.group + G) for o in base.options)
    variants = []
    for var in base.variants:
        cols = {}
        for fld in dataclasses.fields(var):
            val = getattr(var, fld.name)
            if isinstance(val, np.ndarray) and val.shape[:1] == (len(base.options),):
                cols[fld.name] = np.concatenate([val, val * f if fld.name in TIME_FIELDS else val])
        p2p = np.full((2 * G, 2 * G), cross_s)
        p2p[:G, :G] = var.p2p_time
        p2p[G:, G:] = var.p2p_time * f
        variants.append(dataclasses.replace(var, p2p_time=p2p, **cols))
    types = [g.split("@")[0] for g in base.groups]
    return dataclasses.replace(base, groups=tuple(f"{t}-{i}@a" for i, t in enumerate(types))
                               + tuple(f"{t}-{i}@b" for i, t in enumerate(types)),
                               group_capacity=base.group_capacity * 2, options=options, variants=tuple(variants))


def twin(problem: Problem, a: Assignment) -> Assignment:
    """The plan on island "a" with the same stages (option i of "b" is option i - n of "a")."""
    n = problem.num_options // 2
    return Assignment(a.variant, tuple(Stage(s.option - n, s.num_layers) for s in a.stages))


def test_dominance_is_right_both_ways_and_fails_when_a_twin_is_cheaper():
    checked = 0
    for seed in range(12):
        p = mirrored(seed)
        for v in range(len(p.variants)):
            assert island_split.dominates(p, v, 0, 1)
            inside_b = np.array([problem_island(p, o) == 1 for o in p.options])
            if not (p.variants[v].allowed & inside_b).any():
                continue
            checked += 1
            assert not island_split.dominates(p, v, 1, 0), seed
            assert island_split.kept_islands(p, v) == {0}
            # one option of "b" made faster than its twin: no longer dominated
            i = int(np.flatnonzero(p.variants[v].allowed & inside_b)[0])
            lt = p.variants[v].layer_time.copy()
            lt[i] = 0.5 * lt[i - p.num_options // 2]
            q = dataclasses.replace(p, variants=tuple(dataclasses.replace(var, layer_time=lt) if w == v else var
                                                      for w, var in enumerate(p.variants)))
            assert not island_split.dominates(q, v, 0, 1), seed
        eq = mirrored(seed, equal=True)
        assert all(island_split.kept_islands(eq, v) == {0} for v in range(len(eq.variants)))  # ties: the lower index
    assert checked >= 8


def problem_island(p: Problem, o: Option) -> int:
    return int(p.group_island[o.group])


def test_every_plan_inside_the_dominated_island_has_a_no_slower_twin():
    plans = 0
    for seed in range(10):
        p = mirrored(seed, cross_s=0.01)  # (a fast link: plans across the islands are enumerated too)
        for a in feasible_assignments(p):
            if all(problem_island(p, p.options[s.option]) == 1 for s in a.stages):
                b = twin(p, a)
                assert not violations(p, b), (seed, a)
                assert evaluate(p, b) <= evaluate(p, a) * (1 + 1e-12), (seed, a)
                plans += 1
    assert plans >= 50


@pytest.mark.parametrize(("cross_s", "min_split"), [(5.0, 4), (0.02, 0)])
def test_exact_solvers_keep_brute_force_optimum(cross_s, min_split):
    """With a slow link every node is split by island and island "b" left out; with a faster one some nodes keep
    both islands (plans across them)."""
    proven = split = 0
    for seed in range(20):
        p = mirrored(seed, cross_s=cross_s)
        ref = assert_exact_solvers_match_brute(p, EXACT, check_bound=True)
        proven += ref.status == "OPTIMAL"
        split += get_solver("cpsat")(p, EXACT).stats.get("island_nodes", 0) > 0
    assert proven >= 8 and split >= min_split, (proven, split)
