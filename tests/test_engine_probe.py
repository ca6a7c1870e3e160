"""Eq. N17c (formulations/README.md): a node the LP and the DPs leave open goes to the engine while its tau range is
still up to ENGINE_WIDTH split widths wide; an unfinished probe splits the node. Both outcomes checked against brute
force, with CP-SAT and the MILP as the engine. Eq. N17d: a probe runs at least PROBE_SPENT times the node's own
bounding time."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import all_models_large, random_problem, solve_against_brute

from haap_milp.solvers.common import branch_and_bound as bb
from haap_milp.specs import SolveOptions

EXACT = SolveOptions(time_limit_s=20, relative_gap=0.0, threads=1, seed=0)


def _agrees(name: str, seeds, most_fails: int | None = None) -> dict:
    """Solve each seed's problem with ``name`` and brute force; assert the same status, optimum and a valid bound.
    Returns the summed stats the test reads."""
    seen = {"checked": 0, "engine_probes": 0, "probe_fails": 0}
    for seed in seeds:
        problem = random_problem(seed, num_groups=1 + seed % 2, num_layers=6 + seed % 3, max_stages=4, max_options=6)
        res = solve_against_brute(problem, name, EXACT, seed)
        if res is None:
            continue
        seen["checked"] += 1
        for key in ("engine_probes", "probe_fails"):
            seen[key] += res.stats.get(key, 0)
        if most_fails is not None:
            assert res.stats.get("probe_fails", 0) <= most_fails, (seed, res.stats)
    return seen


@pytest.mark.parametrize("name", ["cpsat", "milp"])
def test_every_node_probed_at_any_width_still_matches_brute_force(name, monkeypatch):
    """Every node the LP and DPs leave open goes to the engine whatever its tau range (ENGINE_WIDTH huge, the model
    treated as large so that eq. N17b does not take it): the engine's answer on a wide node must be exact too."""
    monkeypatch.setattr(bb, "ENGINE_WIDTH", 1e12)
    monkeypatch.setattr(bb, "PROBE_FAILS", 10**9)
    all_models_large(monkeypatch)
    seen = _agrees(name, range(20))
    assert seen["checked"] >= 10 and seen["engine_probes"] >= 5, seen


def _probes_time_out(monkeypatch) -> None:
    """Every probe (an engine run capped at its process's probe time, ``st.probe_s``: PROBE_S here, more on a node
    worker, eq. PAR2b) ends unfinished, as CP-SAT does on a large node: NO_SOLUTION without a bound. The engine runs
    of narrow nodes (no cap) are real."""
    call = bb._call

    def timed_out(problem, options, st, lm, nb, cutoff, share, hint, name, solve_node, v, **kw):
        if share <= st.probe_s:
            st.engine_calls += 1
            return bb.VariantResult("NO_SOLUTION")
        return call(problem, options, st, lm, nb, cutoff, share, hint, name, solve_node, v, **kw)

    monkeypatch.setattr(bb, "_call", timed_out)


@pytest.mark.parametrize("name", ["cpsat", "milp"])
@pytest.mark.parametrize("fails", [1, 10**9])
def test_unfinished_probes_split_the_node_and_stay_exact(name, fails, monkeypatch):
    """An unfinished probe must split the node, not close it or retry it; after PROBE_FAILS of them the search goes
    back to one split width (no more probes). Fails if an unfinished probe dropped its node, or if the guard let more
    probes run."""
    monkeypatch.setattr(bb, "ENGINE_WIDTH", 1e12)
    monkeypatch.setattr(bb, "PROBE_FAILS", fails)
    monkeypatch.setattr(bb, "PROBE_SPENT", 0.0)  # (every probe capped at PROBE_S: ``_probes_time_out`` tells them so)
    all_models_large(monkeypatch)
    _probes_time_out(monkeypatch)
    seen = _agrees(name, range(20), most_fails=fails)
    assert seen["checked"] >= 10 and seen["probe_fails"] >= 5, seen


def test_a_probe_runs_for_spent_times_the_nodes_bounding(monkeypatch):
    """Eq. N17d: with PROBE_S negligible, each probe's engine time is PROBE_SPENT times what its node spent before it
    (measured in the node, > 0), and the search stays exact with such short probes. Fails if the node's time does not
    reach the engine (every probe would get PROBE_S)."""
    shares, now = [], {}
    engine, call = bb._engine, bb._call

    def watched_engine(*args, probe=False, spent_s=0.0, **kw):
        now.update(probe=probe, spent=spent_s)
        return engine(*args, probe=probe, spent_s=spent_s, **kw)

    def watched_call(problem, options, st, lm, nb, cutoff, share, *rest, **kw):
        if now.get("probe"):
            shares.append((share, now["spent"]))
        return call(problem, options, st, lm, nb, cutoff, share, *rest, **kw)

    monkeypatch.setattr(bb, "ENGINE_WIDTH", 1e12)
    monkeypatch.setattr(bb, "PROBE_FAILS", 10**9)
    monkeypatch.setattr(bb, "PROBE_S", 1e-6)
    monkeypatch.setattr(bb, "PROBE_SPENT", 3.0)
    all_models_large(monkeypatch)
    monkeypatch.setattr(bb, "_engine", watched_engine)
    monkeypatch.setattr(bb, "_call", watched_call)
    seen = _agrees("cpsat", range(20))
    assert seen["checked"] >= 10 and len(shares) >= 5, (seen, len(shares))
    for share, spent in shares:
        assert spent > 0 and share == pytest.approx(3.0 * spent), (share, spent)
