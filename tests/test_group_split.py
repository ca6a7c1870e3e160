"""Eq. N15 (solvers/common/group_split.py): the group-split bound never exceeds the least of eq. N4's right side over
the node's plans (every group's GPUs within its capacity, every stage allowed at its own slot), by brute force on
small instances; and it lifts eq. N4's Lagrangian bound on some nodes (else it would be dead weight)."""

from __future__ import annotations

import itertools
import math
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import random_problem, variant_nodes, with_binding_budget
from test_stage_dp import _with_mixed

from haap_milp.solvers.common import group_split
from haap_milp.solvers.common.dual_bundle import bundle_bound, with_gpu_time
from haap_milp.solvers.common.stage_dp import PathDP, node_bound
from haap_milp.specs import SolveOptions

EXACT = SolveOptions(time_limit_s=20, relative_gap=0.0, threads=1, seed=0)


def _node_optimum(dp: PathDP, a: float, gpu_time: bool = False, stages: int | None = None) -> float:
    """min over the node's pipelines (stage count in [p_first, k_max], every priced row within its capacity: the
    groups' GPUs and the budget) of (M - 1) tau + sum of the stages' slot costs + the links between their
    endpoints, at tau = a; ``gpu_time``: at the least tau in [a, b] that meets eq. C1 (sum_j d_jg t_j <= cap_g tau,
    each stage's own time), the plans with none left out; ``stages``: only the pipelines of that many stages; inf when
    there is none."""
    t, L, c = dp.t, dp.L, dp.t.coef
    cap = dp.cap
    best = math.inf
    for P in range(max(dp.p_first, 1), dp.k_max + 1):
        if stages is not None and P != stages:
            continue
        tables = [dp._base(P - j, j == 0) for j in range(P)]  # pipeline order: stage j sits at slot P - j
        for cuts in itertools.combinations(range(1, L), P - 1):
            sizes = np.diff([0, *cuts, L]).tolist()
            allowed = [np.flatnonzero(np.isfinite(tables[j][:, n])) for j, n in enumerate(sizes)]
            for combo in itertools.product(*allowed):
                if np.any(dp.usage[list(combo)].sum(axis=0) > cap * (1 + 1e-9)):
                    continue
                tau = a
                if gpu_time:
                    work = [n * c["layer_time"][i] + (c["first_time"][i] if j == 0 else 0.0)
                            + (c["last_time"][i] if j == P - 1 else 0.0) for j, (i, n) in enumerate(zip(combo, sizes))]
                    gt = sum(w * dp.usage[i, :dp.G] for w, i in zip(work, combo))
                    tau = max(a, float(np.max(gt / np.maximum(cap[:dp.G], 1e-30))))
                    if tau > dp.b * (1 + 1e-9):
                        continue
                total = t.tau_weight * tau + sum(float(tables[j][i, n]) for j, (i, n) in enumerate(zip(combo, sizes)))
                ends = [int(t.group[i]) for i in combo]
                total += sum(float(dp.link[e, f]) for e, f in itertools.pairwise(ends))
                best = min(best, total)
    return best


def _nodes(seeds, budget: bool = False, mixed: bool = False):
    """(problem, dp, a) per variant node that eq. N15 applies to: tau in [tau_lb, 1.01 x the worst]; ``budget``:
    each problem with a binding price budget (eq. W1); ``mixed``: with mixed options (eq. H1) added."""
    rng = np.random.default_rng(5)
    for seed in seeds:
        problem = random_problem(seed, uniform=False, same_tp_first_last=False)
        if mixed and (problem := _with_mixed(problem, rng)) is None:
            continue
        if budget and (problem := with_binding_budget(problem, rng, EXACT)) is None:
            continue
        for _, dp, a in variant_nodes(problem):
            if group_split.applies(dp):
                yield problem, dp, a


@pytest.mark.parametrize("mixed", [False, True])
def test_group_split_is_a_lower_bound_and_lifts_eq_n4(mixed):
    checked = lifted = with_mix = 0
    for problem, dp, a in _nodes(range(60), mixed=mixed):
        with_mix += bool((dp.row_usage[:, :dp.G] > 0).sum(axis=1).max() > 1)
        mu = np.zeros(len(dp.cap))
        gs = group_split.group_split_bound(dp, a, mu)
        opt = _node_optimum(dp, a)
        assert gs <= opt + 1e-9 * max(1.0, abs(opt)), (gs, opt)
        if math.isinf(opt):
            continue
        checked += 1
        nb = node_bound(problem, dp.t, a, dp.b, dp.p_first, dp.k_max, None, None, dp)
        lifted += gs > nb.bound_s * (1 + 1e-6)
    assert checked >= 20, checked
    assert lifted >= 1, (lifted, checked)
    assert with_mix >= 10 if mixed else with_mix == 0, with_mix


def test_group_split_with_a_binding_budget_and_the_gpu_time_rows_priced():
    """With a binding budget (eq. W1) the budget row keeps eq. N11's multiplier, and eq. N12's lam may price the
    GPU-time rows around it (``with_gpu_time``); each stays at most the node's least cost over plans within every
    row, and the budget row is really priced on some nodes."""
    checked = priced = 0
    for problem, dp, a in _nodes(range(40), budget=True):
        assert len(dp.cap) == dp.G + 1  # the budget row follows the groups'
        nb = bundle_bound(problem, dp.t, a, dp, None, None, b=dp.b)
        mu = nb.mu[:len(dp.cap)]
        plain = group_split.group_split_bound(dp, a, mu)
        both = with_gpu_time(dp, dp.t, a, nb.mu, group_split.priced_bound, dp, a, mu)[0]
        opt, opt_c1 = _node_optimum(dp, a), _node_optimum(dp, a, gpu_time=True)
        tol = 1e-9 * max(1.0, abs(opt_c1))
        assert plain <= opt + tol and both <= opt_c1 + tol, (plain, opt, both, opt_c1)
        checked += math.isfinite(opt)
        priced += mu[dp.G] > 0
    assert checked >= 10 and priced >= 1, (checked, priced)
