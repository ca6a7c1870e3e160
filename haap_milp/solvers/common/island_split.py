"""Eq. N9b: islands apart as branches, and islands dominated by others left out (formulations/README.md).

Where no link between two islands is usable in a node (every such link has c/2 > b: a plan's tau is at least half of
each of its links, eq. T2, and vpp halves on an interleaved variant, eq. I2), every plan of the node lies inside one
island (eq. N9). Eq. N9 bounds each island by its own DPs; the node's LP and the engine still see all islands at once,
and their relaxations mix paths of several islands, each using a share of every island's GPUs. Eq. N9b gives each island
its own child node instead, so that every bound and the engine see one island. An island B is left out when another
island A, kept, holds a twin of every option of B that is at least as good (``dominates``): then every plan inside B has
a plan inside A, of the same stages, with no larger T, and the search needs only A's. Measured: llama3-70b on 4096 GPUs
of three types split over two islands (``@ib``, ``@roce``, a 100 Gb/s link between them); the search over one island
alone proved its optimum in 7.3 s end to end against 14.4 % gap at 10 s (3.9 % at 60 s) with both.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np

from haap_milp import worker
from haap_milp.problem import Problem
from haap_milp.solvers.common.slot_bounds import Tables, stage_count_bounds, subset, usable_options
from haap_milp.solvers.common.stage_dp import link_usable

# per-option costs of a Variant where the twin must be no larger (times in s, memory in bytes); mem_capacity: no
# smaller; ``allowed``: allowed wherever B's option is. Any other per-option array must be equal (``_same_fields``).
LE_FIELDS = ("layer_time", "first_time", "last_time", "layer_static_mem", "layer_act_mem", "first_static_mem",
             "first_act_mem", "last_static_mem", "last_act_mem", "fixed_mem", "sync_fixed", "sync_per_layer",
             "sync_first", "sync_last")
EXTRA_FIELDS = ("per_stage", "per_layer", "first", "last")  # eq. EX1's terms (no larger)
_MEMO = worker.carry(threading.local())  # the kept islands per variant object (as slot_bounds' memory part)


def gpu_type(name: str) -> str:
    """The GPU type of a group name ``type@island``."""
    return name.rsplit("@", 1)[0]


def option_islands(problem: Problem, t: Tables) -> np.ndarray | None:
    """[n] the island (``problem.group_island``) of each of the tables' options; None when some option draws on
    groups of several islands, or when the problem has one island."""
    if problem.group_island.max(initial=0) == 0:
        return None
    own = _memo(problem)["own"][t.opts]
    return None if (own < 0).any() else own


def apart(problem: Problem, t: Tables, b: float | None) -> np.ndarray | None:
    """[n] each option's island when no link between two islands is usable at tau <= b among the node's usable
    options (then every plan of the node lies in one island); None otherwise."""
    if b is None:
        return None
    own = option_islands(problem, t)
    if own is None:
        return None
    used = t.holding()
    ends = np.unique(t.group[used])
    end_isl = {int(e): int(own[used & (t.group == e)][0]) for e in ends}
    if len(set(end_isl.values())) < 2:
        return own
    isl = np.array([end_isl[int(e)] for e in ends])
    cross = isl[:, None] != isl[None, :]
    ok = link_usable(t.p2p[np.ix_(ends, ends)], b, t.vpp)
    return None if (ok & cross).any() else own


def kept_parts(problem: Problem, t: Tables, b: float | None) -> tuple[np.ndarray, list[int]] | None:
    """Under eq. N9b (``apart``): ([n] each option's island, the islands, ascending, that hold an option able to take a
    layer and that no other kept island dominates); None when a link between islands is usable at tau <= b."""
    own = apart(problem, t, b)
    if own is None:
        return None
    return own, sorted(set(own[t.holding()].tolist()) & kept_islands(problem, t.v))


def inside(problem: Problem, a, island: int) -> bool:
    """Every stage of assignment ``a`` draws only on groups of ``island``."""
    isl = problem.group_island
    return all(isl[g] == island for st in a.stages for g, _ in problem.options[st.option].usage)


def restrict(problem: Problem, t: Tables, own: np.ndarray, island: int) -> Tables:
    """The node's tables with only island ``island``'s options (``own``: [n] each option's island), their stage-count
    range recomputed."""
    out = subset(t, own == island)
    stage_count_bounds(problem, out)
    return out


def kept_islands(problem: Problem, v: int) -> frozenset[int]:
    """The islands of variant v that no other kept island dominates (ties: the lower index is kept)."""
    memo = _memo(problem)
    var = problem.variants[v]
    hit = memo["variants"].get(id(var))
    if hit is not None and hit[0] is var:
        return hit[1]
    n = int(problem.group_island.max(initial=0)) + 1
    usable = _usable(problem, v)
    dom = np.array([[a != b and dominates(problem, v, a, b, usable) for b in range(n)] for a in range(n)])
    kept = set(range(n))
    for b in range(n):  # B goes when a kept A dominates it and B does not dominate A back with a lower index
        if any(dom[a, b] and a in kept and not (dom[b, a] and b < a) for a in range(n)):
            kept.discard(b)
    out = frozenset(kept)
    memo["variants"][id(var)] = (var, out)
    return out


def _memo(problem: Problem) -> dict:
    """What depends on the problem's options, capacities and budget alone, kept for the last problem seen (per
    thread): ``own`` [O] each option's island (-1: groups of several), ``by_key`` per island {twin key: options}
    (``_key``), ``variants``: kept_islands' results."""
    memo = _MEMO.__dict__
    if memo.get("options") is not problem.options or memo.get("caps") != problem.group_capacity \
            or memo.get("budget") is not problem.budget:
        isl = problem.group_island
        own = np.array([int(isl[o.usage[0][0]]) if len({int(isl[g]) for g, _ in o.usage}) == 1 else -1
                        for o in problem.options], np.int64)
        keys = [_key(problem, o) for o in problem.options]
        by_key: dict[int, dict] = {}
        for i, k in enumerate(keys):
            if own[i] >= 0:
                by_key.setdefault(int(own[i]), {}).setdefault(k, []).append(i)
        memo.update(options=problem.options, caps=problem.group_capacity, budget=problem.budget, own=own, keys=keys, by_key=by_key, variants={})
    return memo


def _island_groups(problem: Problem, island: int) -> dict[str, int] | None:
    """GPU type -> group of the island; None when two groups of the island share a type."""
    out: dict[str, int] = {}
    for g, name in enumerate(problem.groups):
        if problem.group_island[g] == island:
            if gpu_type(name) in out:
                return None
            out[gpu_type(name)] = g
    return out


def _key(problem: Problem, o) -> tuple:
    """An option's identity with its groups replaced by their GPU types (twins across islands share it)."""
    mix = tuple((gpu_type(problem.groups[r.group]), r.tp, r.count, r.samples) for r in o.mix)
    plain = dataclasses.replace(o, group=0, link=-1, mix=())
    return gpu_type(problem.groups[o.group]), mix, plain


def _usable(problem: Problem, v: int) -> np.ndarray:
    """[O] the options usable in variant v (``slot_bounds.usable_options``) as a mask."""
    out = np.zeros(problem.num_options, bool)
    out[usable_options(problem, v)] = True
    return out


def dominates(problem: Problem, v: int, a: int, b: int, usable: np.ndarray | None = None) -> bool:
    """Island ``a`` dominates island ``b`` in variant v: for each GPU type of b, a holds at least as many GPUs of it,
    and each option of b usable in v has a twin in a (the same degrees and recomputation on a's group of the same type)
    that is usable, no slower in every time term, no larger in memory, budget weight and eq. EX1's terms, with no less
    memory per GPU, and whose endpoints' links are no slower, pair by pair. A plan inside b then has a plan inside a
    (each stage on its twin, the same layers) that fits wherever it fits and has no larger T: T is non-decreasing in
    every stage time, link time and sync time (eqs. T1-T3, I1: sigma's credit beta <= 1 is taken from the sum of the
    stage times it is subtracted from). ``usable``: ``_usable(problem, v)`` when the caller has it."""
    ga, gb = _island_groups(problem, a), _island_groups(problem, b)
    if ga is None or gb is None:
        return False
    for typ, g in gb.items():
        if problem.group_capacity[g] > 0 and (typ not in ga or problem.group_capacity[ga[typ]] < problem.group_capacity[g]):
            return False
    memo, var = _memo(problem), problem.variants[v]
    usable = _usable(problem, v) if usable is None else usable
    twins = memo["by_key"].get(a, {})
    pairs = []  # (option of b, its twin in a)
    for i in np.flatnonzero(usable & (memo["own"] == b)).tolist():
        j = next((j for j in twins.get(memo["keys"][i], ()) if usable[j]), None)
        if j is None:
            return False
        pairs.append((i, j))
    if not pairs:
        return True  # no plan lies inside b
    ib, ia = (np.array(x) for x in zip(*pairs))
    if not _costs_le(problem, var, ia, ib):
        return False
    ends: dict[int, int] = {}
    for i, j in pairs:
        e, f = problem.options[i].endpoint, problem.options[j].endpoint
        if ends.setdefault(e, f) != f:
            return False
    eb, ea = np.array(list(ends)), np.array(list(ends.values()))
    p2p = np.asarray(var.p2p_time, float)
    return bool((p2p[np.ix_(ea, ea)] <= p2p[np.ix_(eb, eb)]).all())


def _costs_le(problem: Problem, var, ia: np.ndarray, ib: np.ndarray) -> bool:
    """Every per-option cost of the twins ``ia`` no larger than that of ``ib``'s options (see ``dominates``)."""
    for name in LE_FIELDS:
        arr = np.asarray(getattr(var, name), float)
        if not (arr[ia] <= arr[ib]).all():
            return False
    if not (np.asarray(var.mem_capacity, float)[ia] >= np.asarray(var.mem_capacity, float)[ib]).all():
        return False
    if not _same_fields(problem, var, ia, ib):
        return False
    if problem.budget is not None and not (problem.budget.weight[ia] <= problem.budget.weight[ib]).all():
        return False
    x = var.extra
    return x is None or all((np.asarray(getattr(x, f), float)[ia] <= np.asarray(getattr(x, f), float)[ib]).all()
                            for f in EXTRA_FIELDS)


def _same_fields(problem: Problem, var, ia: np.ndarray, ib: np.ndarray) -> bool:
    """Per-option arrays of the variant this module does not know: equal for the twins (a new cost term is then
    compared strictly rather than missed)."""
    O = problem.num_options
    known = set(LE_FIELDS) | {"mem_capacity", "allowed", "p2p_time"}
    for f in dataclasses.fields(var):
        val = getattr(var, f.name)
        if f.name in known or not isinstance(val, np.ndarray) or val.shape[:1] != (O,):
            continue
        if not np.array_equal(val[ia], val[ib]):
            return False
    return True
