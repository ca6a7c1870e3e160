"""presolve.build and presolve.decode, tested directly on tiny specs (tests/spec_oracle.py).

* pruning is sound: putting back any single option presolve pruned for a variant (memory or
  dominance) never yields a better brute-force optimum, nor does putting back all of them;
* the eq. B1 bound of each variant is at most the brute-force optimum of that variant;
* decode maps an assignment to the Plan it stands for: check_plan accepts it exactly when
  ``problem.violations`` does, and the estimator scores it at ``problem.evaluate``.
"""

from __future__ import annotations

import pathlib
import sys
from dataclasses import replace

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from spec_oracle import TINY_MODEL, TINY_TRAINING, tiny_cluster

from haap_milp import presolve
from haap_milp.check import check_plan
from haap_milp.estimator import Estimator
from haap_milp.problem import Assignment, Stage, evaluate, violations
from haap_milp.solvers import get_solver
from haap_milp.specs import SolveOptions

CASES = {
    "one-island": (tiny_cluster(10, 7), SolveOptions(max_stages=3)),
    "two-islands-megatron": (tiny_cluster(9, 6, 5.0), SolveOptions(max_stages=3, target="megatron")),
    "flagscale": (tiny_cluster(8, 5), SolveOptions(max_stages=3, target="flagscale")),
}
BRUTE = get_solver("brute")


@pytest.fixture(scope="module", params=sorted(CASES))
def built(request):
    cluster, options = CASES[request.param]
    est = Estimator(TINY_MODEL, cluster, TINY_TRAINING)
    return cluster, options, est, presolve.build(TINY_MODEL, cluster, TINY_TRAINING, options, est)


def _priced(problem, v):
    """Options presolve enumerated and priced for variant v (dp divides B; a mixed option splits B itself, eq. H2):
    kept or pruned."""
    var = problem.variants[v]
    return np.array([var.layer_time[i] > 0 and (bool(o.mix) or var.samples_per_microbatch % o.dp == 0)
                     for i, o in enumerate(problem.options)])


def _with_allowed(problem, v, allowed):
    return replace(problem, variants=(replace(problem.variants[v], allowed=allowed),))


def test_stats_count_what_was_kept(built):
    _, _, _, pre = built
    p = pre.problem
    assert pre.stats["options_kept"] == sum(int(v.allowed.sum()) for v in p.variants)
    # something was pruned here; under a uniform target no option outclasses another of a different signature
    # (eq. U1), so the tiny uniform case may keep them all
    assert pre.stats["options_kept"] < pre.stats["options_enumerated"] or p.uniform
    assert pre.stats["variants_kept"] == len(p.variants) == len(pre.lower_bounds_s)


def test_pruning_is_sound(built):
    _, _, _, pre = built
    p = pre.problem
    pruned_total = 0
    for v, var in enumerate(p.variants):
        priced = _priced(p, v)
        assert not (var.allowed & ~priced).any()
        kept = BRUTE(_with_allowed(p, v, var.allowed))
        best = kept.objective_s if kept.status == "OPTIMAL" else np.inf
        for i in np.flatnonzero(priced & ~var.allowed):
            pruned_total += 1
            one = var.allowed.copy()
            one[i] = True
            got = BRUTE(_with_allowed(p, v, one))
            if got.status == "OPTIMAL":
                assert got.objective_s >= best * (1 - 1e-12), (f"pruned option {p.options[i]} of B="
                                                               f"{var.samples_per_microbatch} beats the kept optimum")
        every = BRUTE(_with_allowed(p, v, priced))
        if every.status == "OPTIMAL":
            assert every.objective_s >= best * (1 - 1e-12)
    assert pruned_total > 0 or p.uniform  # (see test_stats_count_what_was_kept)


def test_lower_bound_per_variant_is_below_its_optimum(built):
    _, _, _, pre = built
    p = pre.problem
    solved = 0
    for v, var in enumerate(p.variants):
        got = BRUTE(_with_allowed(p, v, var.allowed))
        if got.status == "OPTIMAL":
            solved += 1
            assert 0 < pre.lower_bounds_s[v] <= got.objective_s * (1 + 1e-12), v
    assert solved > 0
    assert pre.lower_bound_s == min(pre.lower_bounds_s.values())


def _sample_assignments(p, rng, n):
    """n random assignments within the GPU counts (memory and engine rules unchecked)."""
    out = []
    while len(out) < n:
        v = int(rng.integers(len(p.variants)))
        ok = np.flatnonzero(p.variants[v].allowed)
        k = int(rng.integers(1, p.max_stages + 1))
        cuts = sorted(rng.choice(np.arange(1, p.num_layers), size=k - 1, replace=False).tolist())
        sizes = np.diff([0, *cuts, p.num_layers])
        a = Assignment(v, tuple(Stage(int(rng.choice(ok)), int(s)) for s in sizes))
        if not [m for m in violations(p, a) if " GPUs of " in m]:
            out.append(a)
    return out


def test_decode_round_trip(built):
    cluster, options, est, pre = built
    p = pre.problem
    rng = np.random.default_rng(0)
    samples = _sample_assignments(p, rng, 25)
    best = BRUTE(p)
    samples.append(best.assignment)
    n_ok = 0
    for a in samples:
        plan = presolve.decode(pre, a, TINY_MODEL, cluster, TINY_TRAINING)
        var = p.variants[a.variant]
        assert plan.samples_per_microbatch == var.samples_per_microbatch
        assert plan.num_microbatches == var.num_microbatches
        assert plan.global_batch_size == TINY_TRAINING.global_batch_size
        first = 0
        for s, st in zip(plan.stages, a.stages):
            o = p.options[st.option]
            g = pre.groups[o.group]
            assert (s.first_layer, s.num_layers) == (first, st.num_layers)
            assert (s.gpu_type, s.island, s.tp, s.dp, s.ep, s.recompute) == (g.gpu_type, g.island, o.tp, o.dp,
                                                                               o.ep, o.recompute)
            first += st.num_layers
        assert est.estimate(plan).iteration_time_s == pytest.approx(evaluate(p, a), rel=1e-9)
        bad = violations(p, a)
        found = check_plan(plan, TINY_MODEL, cluster, TINY_TRAINING, target=options.target, estimator=est)
        assert (bad == []) == (found == []), (bad, found)
        n_ok += bad == []
    assert 0 < n_ok < len(samples)  # both valid and invalid plans were compared


def test_microbatch_candidates_are_divisors_found_in_sqrt_steps():
    """Samples per micro-batch: the divisors of gbs up to 8 per GPU, equal to trial division on small batches, and
    at --gbs 1e8 (the schema's limit) found from divisor pairs: trial division up to gbs took 3.5 s there."""
    from haap_milp.specs import TrainingSpec

    for n in (1, 2, 12, 97, 360, 1024, 5040):
        assert presolve.divisors(n, n) == [d for d in range(1, n + 1) if n % d == 0]
        assert presolve.divisors(n, 7) == [d for d in range(1, min(n, 7) + 1) if n % d == 0]
    big = TrainingSpec(global_batch_size=10**8, seq_len=128)
    assert presolve.microbatch_candidates(big, 192, SolveOptions()) == [
        d for d in range(1, 8 * 192 + 1) if 10**8 % d == 0]
