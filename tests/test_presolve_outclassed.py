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
