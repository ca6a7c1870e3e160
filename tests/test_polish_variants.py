"""Eq. LS1b (polish's variant moves) against brute force: on random problems with several micro-batch variants and
interleaved copies, polish from plain plans spread over each problem's enumeration returns a feasible plan no slower
than its start, never one a variant move of the polished plan would still improve, and moves plans to another variant
on a good share of starts."""

from __future__ import annotations

import pathlib
import sys
from dataclasses import replace

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import feasible_plans, random_problem

from haap_milp.interleave import interleaved_variants
from haap_milp.problem import Assignment, evaluate, violations
from haap_milp.solvers.common import polish as polish_mod

STARTS = 20  # starts per problem at most, evenly spread over its plain plans


def test_variant_moves_keep_plans_feasible_better_and_move_them(monkeypatch):
    moved = starts = 0
    for seed in range(12):
        base = random_problem(seed, num_layers=6, max_stages=4, max_options=4, num_variants=3)
        extra = interleaved_variants(base.variants, (2,), base.max_stages, base.num_layers)
        problem = replace(base, variants=base.variants + tuple(extra))
        plain = list(feasible_plans(problem, [v for v, w in enumerate(problem.variants) if w.vpp == 1]))
        plans = plain[:: max(7, -(-len(plain) // STARTS))]  # (every 7th plan when written: 2617 starts, 2140 moved)
        for a in plans:
            got = polish_mod.polish(problem, a)
            assert violations(problem, got) == []
            assert evaluate(problem, got) <= evaluate(problem, a) * (1 + 1e-12)
            here = evaluate(problem, got)  # a local optimum of every move, the variant moves too
            for v in range(len(problem.variants)):
                cand = Assignment(v, got.stages)
                if not violations(problem, cand):
                    assert evaluate(problem, cand) >= here * (1 - 1e-12), (seed, v)
            starts += 1
            moved += got.variant != a.variant
            monkeypatch.setattr(polish_mod, "USE_VARIANT_MOVES", False)
            assert polish_mod.polish(problem, a).variant == a.variant  # (without them no plan leaves its variant)
            monkeypatch.setattr(polish_mod, "USE_VARIANT_MOVES", True)
    assert starts >= 50 and moved >= starts // 10, (starts, moved)  # 201 starts, 149 moved
