"""Eq. DP3 (solvers/dp/core.py ``coverage``): per stage count P, the most layers a structure of contiguous group
segments holds within tau, against brute force over every structure (group order, one class per segment, slots per
segment) on small instances. The brute force prices each slot from ``stage_caps`` directly (eqs. DP1, DP2): a
segment's bottom slot has tau less the link to the segment below (0 at slot 1), its other slots tau less the link
inside the group, the pipeline's first stage its first-stage caps; every slot holds at least one layer and a
segment's stages fit the group's GPUs."""

from __future__ import annotations

import itertools
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import random_problem

from haap_milp.solvers.common import build_tables
from haap_milp.solvers.dp import _candidates, _restrictions
from haap_milp.solvers.dp.core import CapCache, coverage, group_links, option_classes, stage_caps

NEG = -(10**9)


def _segment_layers(t, r, cls, c, s, e, tau, below, inner, final):
    """Layers class c holds on slots s+1..e (NEG where a slot holds none)."""
    mem = cls.members[c]
    total = 0
    for k in range(s + 1, e + 1):
        h, hf = stage_caps(t, tau - (below if k == s + 1 else inner), r)
        got = int((hf if final and k == e else h)[k - 1, mem].max())
        if got < 1:
            return NEG
        total += got
    return total


def _brute(t, r, cls, caps, tau, charge, max_segments):
    """{P: most layers} over every structure (the P where it reaches L)."""
    groups = sorted({int(g) for g in cls.group})
    best: dict = {}
    for n in range(1, min(max_segments, len(groups)) + 1):
        for order in itertools.permutations(groups, n):
            choices = [np.flatnonzero(cls.group == g).tolist() for g in order]
            for classes in itertools.product(*choices):
                for spans in itertools.product(range(1, t.K + 1), repeat=n):
                    if sum(spans) > t.K or any(sp * int(cls.gpus[c]) > caps[g]
                                               for sp, c, g in zip(spans, classes, order)):
                        continue
                    total, s = 0, 0
                    for i, (g, c, sp) in enumerate(zip(order, classes, spans)):
                        below = 0.0 if i == 0 else float(charge[g, order[i - 1]])
                        got = _segment_layers(t, r, cls, c, s, s + sp, tau, below, float(charge[g, g]), i == n - 1)
                        total = NEG if got == NEG else total + got
                        s += sp
                    P = s
                    if total >= t.L and P <= t.L:
                        best[P] = max(best.get(P, NEG), total)
    return best


def _runs(seeds, *, holding: bool = True):
    """(seed, problem, v, tables, restriction, classes, charge, candidates) of each DP run of small random problems
    (``holding``: only variants whose GPUs can hold a plan, p_min > 0)."""
    for seed in seeds:
        problem = random_problem(seed, max_stages=int(seed % 3) + 2, max_options=5)
        for v in range(len(problem.variants)):
            t = build_tables(problem, v)
            if holding and t.p_min == 0:
                continue
            for r in _restrictions(problem, t):
                cls = option_classes(t, r)
                if len(cls.members):
                    yield seed, problem, v, t, r, cls, group_links(t, r.every, t.p2p), _candidates(t, r)


def test_coverage_is_the_most_layers_per_stage_count():
    checked = reached = 0
    for seed, problem, v, t, r, cls, charge, cand in _runs(range(40)):
        for tau in cand[np.linspace(0, len(cand) - 1, 5).astype(int)].tolist():
            got = coverage(t, cls, CapCache(t, r, cls), problem.group_capacity, tau, 6, charge)
            want = _brute(t, r, cls, problem.group_capacity, tau, charge, 6)
            assert {p: v_ for p, (v_, _) in got.items()} == want, (seed, v, tau)
            for p, (layers, structure) in got.items():  # the structure returned holds what it claims
                total = 0
                for i, (g, c, s, e) in enumerate(structure):
                    below = 0.0 if i == 0 else float(charge[g, structure[i - 1][0]])
                    total += _segment_layers(t, r, cls, c, s, e, tau, below, float(charge[g, g]),
                                             i == len(structure) - 1)
                assert total == layers and structure[-1][3] == p, (seed, v, tau, p)
            checked += 1
            reached += bool(want)
    assert checked >= 100 and reached >= 30, (checked, reached)


def test_least_tau_is_the_bisections_whatever_the_hints(monkeypatch):
    """Eq. DP3b: ``_least_tau`` ends at the least candidate whose structures hold L layers, the one a plain bisection
    finds, with no hint, the right one, its neighbours or unrelated values first; with the right hint first it tests
    two candidates (the hint and the one below), or one at the list's start."""
    from haap_milp.solvers import dp

    checked = hinted = 0
    for seed, problem, v, t, r, cls, charge, cand in _runs(range(6), holding=False):
        # every candidate up to the first that fits and a few above it (eq. DP3's monotonicity, which the
        # search relies on, on the candidates around the boundary)
        fits = []
        for x in cand:
            fits.append(bool(dp._feasible(problem, t, r, cls, float(x), charge)[0]))
            if fits[-4:] == [True] * 4:
                break
        assert fits == sorted(fits), (seed, v)
        want = fits.index(True) if any(fits) else None
        others = [float(cand[i]) for i in {0, len(cand) // 2, len(cand) - 1}] + [-1.0, 1e9]
        right = [] if want is None else [float(cand[want])] + [float(cand[i]) for i in (want - 1, want + 1)
                                                               if 0 <= i < len(cand)]
        for hints in ([], *([h] for h in others + right), others[:2], right[::-1]):
            monkeypatch.setattr(dp, "_recent", list(hints))
            tests = []
            real = dp._feasible
            monkeypatch.setattr(dp, "_feasible", lambda *a, real=real, tests=tests: tests.append(a[4]) or real(*a))
            got = dp._least_tau(problem, t, r, cls, cand, charge)
            monkeypatch.setattr(dp, "_feasible", real)
            assert (got is None and want is None) or got[0] == want, (seed, v, hints)
            if got is not None:
                assert bool(got[1][0]) and got[1][0] == dp._feasible(problem, t, r, cls, float(cand[want]),
                                                                  charge)[0]
            if want is not None and hints[-1:] == [float(cand[want])]:
                assert len(tests) <= 2, (seed, v, tests)
                hinted += 1
            checked += 1
    assert checked >= 120 and hinted >= 12, (checked, hinted)


def test_a_beam_keeps_the_structures_true_and_no_better_than_brute_force(monkeypatch):
    """Eq. DP3c: with the beam down to one state a level (BEAM_PAIRS 1), every structure returned still holds the
    layers it claims (re-priced slot by slot), within brute force's most; the heuristic only finds less. Fails if
    the beam dropped a state the back pointers still use."""
    from haap_milp.solvers.dp import core

    monkeypatch.setattr(core, "BEAM_PAIRS", 1)
    checked = 0
    for seed, problem, v, t, r, cls, charge, cand in _runs(range(30)):
        if len(set(cls.group.tolist())) < 3:
            continue
        for tau in cand[np.linspace(0, len(cand) - 1, 4).astype(int)].tolist():
            got = coverage(t, cls, CapCache(t, r, cls), problem.group_capacity, tau, 6, charge)
            want = _brute(t, r, cls, problem.group_capacity, tau, charge, 6)
            for p, (layers, structure) in got.items():
                total = 0
                for i, (g, c, s, e) in enumerate(structure):
                    below = 0.0 if i == 0 else float(charge[g, structure[i - 1][0]])
                    total += _segment_layers(t, r, cls, c, s, e, tau, below, float(charge[g, g]),
                                             i == len(structure) - 1)
                assert total == layers <= want[p] and structure[-1][3] == p, (seed, v, tau, p)
                assert len({g for g, *_ in structure}) == len(structure), (seed, v, tau, p)  # each group once
            checked += 1
    assert checked >= 20, checked


def test_many_groups_keep_each_level_within_the_beam(monkeypatch):
    """Eq. DP3c on 16 groups: no level extends more than BEAM_PAIRS / 16 states (C(16, k) k without it: 7,280 at the
    fourth segment), and the run still finds structures. Fails without the beam."""
    from haap_milp.solvers.dp import core

    sizes = []
    level = core._level
    monkeypatch.setattr(core, "_level", lambda keys, F, groups, segs: sizes.append((len(keys), len(groups)))
                        or level(keys, F, groups, segs))
    problem = random_problem(7, num_groups=16, num_layers=8, max_stages=6, max_options=48)
    found = 0
    for v in range(len(problem.variants)):
        t = build_tables(problem, v)
        for r in _restrictions(problem, t):
            cls = option_classes(t, r)
            if len(cls.members):
                cand = _candidates(t, r)
                got = coverage(t, cls, CapCache(t, r, cls), problem.group_capacity, float(cand[-1]), 6,
                               group_links(t, r.every, t.p2p))
                found += bool(got)
    assert found and max(g for _, g in sizes) >= 12, sizes
    assert all(n <= core.BEAM_PAIRS // g for n, g in sizes), max(sizes)
