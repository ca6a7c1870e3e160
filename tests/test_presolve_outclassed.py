"""presolve's outclassed rule keeps every uniform signature another group may need (eq. U1)."""

from __future__ import annotations

import numpy as np

from haap_milp.presolve import _drop_outclassed
from haap_milp.problem import Option

KEYS = ("lt", "ft", "lat", "ls", "la", "fs", "fa", "xs", "xa", "fx", "sl", "s1", "sL")


def _coefs(worse: float, better: float) -> dict[str, np.ndarray]:
    return {k: np.array([worse, better]) for k in KEYS}


def _pair(dims: tuple[str, ...]) -> list[Option]:
    # same group, tp and dp; option 1 (ep 2) is better than option 0 (ep 1) in every coefficient
    return [Option(group=0, tp=8, dp=1, ep=1, recompute="none", uniform_dims=dims),
            Option(group=0, tp=8, dp=1, ep=2, recompute="none", uniform_dims=dims)]


def test_without_uniformity_the_worse_option_is_dropped():
    kept = _drop_outclassed(_pair(("tp", "dp", "recompute")), np.array([True, True]), _coefs(2.0, 1.0))
    assert kept.tolist() == [False, True]


def test_under_a_uniform_target_a_different_ep_cannot_stand_in():
    dims = ("tp", "dp", "recompute", "ep")
    kept = _drop_outclassed(_pair(dims), np.array([True, True]), _coefs(2.0, 1.0), uniform=True)
    assert kept.tolist() == [True, True]


def test_uniform_ep_is_a_valid_flag(run_cli):
    code, _, err = run_cli(["solve", "-m", "llama3-8b", "-c", "h100-80g:8,a100-80g:8", "--gbs", "128", "--uniform",
                            "ep", "--solver", "dp", "--time-limit", "10"])
    assert code == 0, err


def test_a_fixed_micro_batch_that_cannot_divide_the_batch_is_refused_up_front(run_cli):
    code, _, err = run_cli(["solve", "-m", "opt-350m", "-c", "a100-40g:8/4", "--gbs", "64", "--seq", "2048", "--mbs",
                            "3"])
    assert code == 2 and "the fixed micro-batch (3) must divide the global batch (64)" in err, err
    assert "{" not in err  # one paragraph in words, not the options dumped


def _reference(opts, allowed, a, uniform=False):
    """The rule as first written (a double loop in index order): the vectorised form must keep the same set."""
    out = allowed.copy()
    idx = np.flatnonzero(allowed)
    for i in idx:
        for j in idx:
            if i == j or not out[j]:
                continue
            oi, oj = opts[i], opts[j]
            if (oi.group, oi.tp, oi.dp) != (oj.group, oj.tp, oj.dp) or (uniform and oi.signature != oj.signature):
                continue
            # eq. O1f: an exact twin (equal everywhere) is outclassed by the earlier one
            if all(a[k][j] <= a[k][i] for k in KEYS) and (any(a[k][j] < a[k][i] for k in KEYS) or j < i):
                out[i] = False
                break
    return out


def test_vectorised_rule_keeps_what_the_double_loop_keeps():
    rng = np.random.default_rng(7)
    for trial in range(30):
        n = int(rng.integers(2, 40))
        opts = [Option(group=int(rng.integers(0, 2)), tp=int(rng.choice([1, 2])), dp=int(rng.choice([1, 2])),
                       ep=int(rng.choice([1, 2])), recompute=str(rng.choice(["none", "full"]))) for _ in range(n)]
        # few distinct values so that ties and chains of outclassing are common
        a = {k: rng.integers(0, 3, n).astype(float) for k in KEYS}
        allowed = rng.random(n) < 0.85
        for uniform in (False, True):
            got = _drop_outclassed(opts, allowed, a, uniform)
            assert got.tolist() == _reference(opts, allowed, a, uniform).tolist(), (trial, uniform)


def test_exact_twins_keep_one():
    """Eq. O1f: of options equal in every coefficient (same GPUs) the first is kept, the rest dropped; without the
    rule both stayed in the search."""
    opts = [Option(group=0, tp=8, dp=1, ep=1, recompute="none", zero=z) for z in (0, 1, 3)]
    a = {k: np.array([1.0, 1.0, 1.0]) for k in KEYS}
    assert _drop_outclassed(opts, np.array([True, True, True]), a).tolist() == [True, False, False]
    a["fx"] = np.array([2.0, 1.0, 1.0])  # the first is worse in one coefficient: the second outclasses it
    assert _drop_outclassed(opts, np.array([True, True, True]), a).tolist() == [False, True, False]
