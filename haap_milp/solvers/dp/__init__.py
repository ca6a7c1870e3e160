"""DP heuristic of the AutoHAAP / Metis / Alpa family: the baseline and the exact solvers' warm
start (formulations/dp.md). No bound is claimed (bound_s is None).

Per micro-batch variant and engine restriction (eqs. U1/U2):
1. binary search over candidate stage times tau (the values n * layer_time[o] + extras) for the
   smallest tau at which some structure holds L layers (coverage DP, eqs. DP1-DP3);
2. for tau* and up to ``EXTRA_TAUS`` larger candidates inside the window where (M-1)*tau can
   still pay off (eq. DP5), and for up to ``MAX_P_PER_TAU`` stage counts, split the layers with
   Alpa's inner DP (min sum t_j s.t. t_j <= tau, eq. DP4) and score the plan with ``evaluate``;
3. keep each variant's best (regraded, eq. LS2b), improve the 3 lowest, and the 3 lowest as found, by local search
   (eqs. LS1, LS2), keep the best and rewrite it into canonical form (dominated options swapped, eq. D1).
On a cluster of several islands each variant gets a second pass of 1-2 in which links between islands take a share
of their time from the sending stage's budget (eq. DP8b, ``_cross_charge``).
With interleaved copies (vpp > 1 variants), steps 1-3 run on the plain variants first, then on the copies,
those of the plain best's micro-batch first (eq. DP7). The plain variants stop past the best micro-batch (eq. DP8g).
If no structure fits, a beam search over (slot, layers, GPUs used) states (eq. DP6) looks for
any feasible plan; it is complete while the beam is not truncated (all small instances).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from haap_milp.deadline import current
from haap_milp.problem import Assignment, Problem, RawResult, Stage, evaluate, violations
from haap_milp.solvers.common import Tables, build_tables, canonical, infeasibility_reason, island_split
from haap_milp.solvers.common.bounds import root_seed, root_setup, signature_bounds
from haap_milp.solvers.common.polish import Polish, polish, regrade
from haap_milp.solvers.dp.core import CapCache, Restriction, coverage, group_links, option_classes, owners, split
from haap_milp.solvers.dp.fallback import TIME_LIMIT_S, beam_search
from haap_milp.worker import fork_map, forks, shared_queue, taken

log = logging.getLogger(__name__)
EXTRA_TAUS = 4  # candidate stage times tried above the smallest feasible one
MAX_P_PER_TAU = 6  # stage counts split per candidate tau
MAX_SEGMENTS = 6  # most GPU groups in one pipeline (all of them when there are at most 6)
# eq. LS2: the best DP plans of this many variants are polished (eq. LS1), lowest first, and the best result kept.
# llama3-70b x 3 types x 1024 GPUs (benchmarks/solve_scaling.py): variant 3's DP plan (15.263 s) polishes to
# 15.148 s, variant 4's (15.463 s, the 2nd) to 14.714 s (the best plan known: 14.707 s); the 3rd polishes to 16.31 s
POLISH_TOP = 3
# eq. DP8b: a link between islands takes this share of its time from its sending stage's budget in the DP's second pass
# on a several-island cluster (1: no second pass). llama3-70b x 3 types x 1024 GPUs x 2 islands, the DP alone: with
# the whole link (DP2) every plan stays in one island, 26.085 s; shares 0.5 / 0.25 / 0 give 16.369 / 15.586 / 16.895 s
# (before eq. T2's windows). Since the windows (2026-12-07) a link between two stages costs each of them c/2 in the
# window of the pair, so the sender's half is the share: on the 18 one-type-per-island instances (outside.yaml isl18,
# full solves at 10 s) the plans replay 0.862 (geometric mean) of the earlier code's against 0.882 with 0.25
CROSS_SHARE = 0.5
# eq. DP8j: DP8b's second passes stop for the rest of the run after this many variants in a row whose second pass gave
# no plan better than their first pass (None: never). Measured (the DP alone, 2 threads): where each GPU type lies on
# both islands (llama3-70b x 3 types x 2 islands, 256 and 768 GPUs) the second pass beat the first on every variant
# (the crossing plans use both islands' GPUs: 19.42 against 33.55 s); on llama3-70b x 4096 x 4 types x 2 islands on
# none of 36 (13.51 s at best against the first passes' 8.70 s), at 3.6 of the DP's 5.7 CPU s
CROSS_TRIAL = 3
# eq. LS3a: the plans of LS2 are polished in turn, this many candidate plans each (a count, not a clock), so a deadline
# that cuts LS2 leaves each plan a share. llama3-70b x 3 types x 1024 GPUs: variant 3's polish alone takes its whole
# 10,000-candidate budget (15.263 -> 15.148 s) before variant 4's (15.463 -> 14.714 s) starts; in turn, 14.714 s is
# reached after 10,250 candidates instead of ~14,000, and the best after N candidates is never worse from N = 4,000 on
POLISH_CHUNK = 250
# eq. LS2b: each variant's DP plan regraded by eq. LS1e as it is found (the DP chooses options by compute time
# alone), and LS2's starts the POLISH_TOP lowest regraded plans plus the POLISH_TOP lowest DP plans as found.
# deepseek-v3 on 1024 H100 + 1024 A100-80GB (gbs 2048, what ``solve`` searches): 6.3202 -> 5.7760 s (the interleaved
# copy M = 32, vpp 4, P 8 that the DP ranked low with ep 8 on the A100s, 1.9 s syncs); polishing the regraded plans
# alone lost qwen3-235b-a22b x hetero3-4096's 2.3779 s plan (2.4019 s), which LS1 reaches from the DP plan as found,
# hence both sets of starts
USE_REGRADE = True
# eq. DP8g: the plain variants' search stops past the best micro-batch, once a variant's plan is slower than the one
# before it and this share above the best (None: never)
STOP_RISE = 0.10
# eq. DP8i: under eq. U1 the signatures in ascending order of their own eq. B2 bound, none past the best plan
USE_SIGNATURE_BOUND = True
# eq. PAR5e: eq. PAR5b's look-ahead processes take the variants from one shared list as each becomes free (False: the
# even and the odd positions, fixed)
SHARE_LOOK_AHEAD = True


def solve(problem: Problem, options=None, hint: Assignment | None = None) -> RawResult:
    """Best plan the heuristic finds (FEASIBLE), INFEASIBLE when the bounds prove none exists,
    NO_SOLUTION when it finds none without a proof."""
    t0 = time.perf_counter()
    threads = getattr(options, "threads", 1)  # eq. PAR5: LS2's polish on two processes
    dl = current()  # past it (or interrupted) with a plan in hand: stop and return the best so far
    best: tuple[float, Assignment] | None = None
    tried = skipped = ahead = 0  # ahead: runs the loop took from eq. PAR5b's look-ahead
    stopped = rose = False
    bounds = []
    plain = [v for v in range(len(problem.variants)) if problem.variants[v].vpp == 1]
    copies = [v for v in range(len(problem.variants)) if problem.variants[v].vpp != 1]
    polished = None  # the plan polish already returned (not polished twice)
    cross = _CrossTrial()  # eq. DP8j
    found: dict[int, tuple[float, Assignment]] = {}  # variant -> its best DP plan, this phase (eq. LS2)
    raw: dict[int, tuple[float, Assignment]] = {}  # the same before eq. LS2b's regrading
    for phase in (plain, copies):  # eq. DP7: the vpp = 1 variants, then the interleaved copies
        if phase is copies and copies and best is not None:
            # the plain result polished before any copy is searched, then its stages tried on each copy: the copies
            # cannot crowd out the plain variants' polish (qwen3-235b-a22b x hetero3-4096, gbs 2048, the DP's
            # budget in a 10 s solve: 3.251 s with the copies, 3.144 s with --vpp 1, the polish cut by the deadline)
            best = polished = _polish_top(problem, found, raw=raw, threads=threads)
            found, raw = {}, {}
            a = best[1]
            copies.sort(key=lambda w: _copy_rank(problem, a, w))  # in place: ``phase`` is this list
            seeded = _seed_copies(problem, a, copies)
            if seeded is not None and seeded[0] < best[0]:
                a = polish(problem, seeded[1])
                best = polished = (evaluate(problem, a), a)
        # eq. PAR5b: the phase's variants looked at ahead on two processes, each from the best known now
        seen = _look_ahead(problem, phase, best, threads)
        for v in phase:  # tables built one variant at a time: 0.5 s each on 1024 x 6 groups
            if best is not None and dl.expired() and not (v in seen and seen[v].runs):
                stopped = True  # (past the deadline the runs eq. PAR5b's look-ahead made are still taken: free)
                break
            look = seen.get(v) or _Look.of(problem, v)
            vb = look.vb
            root_seed(problem, v, vb)  # (a look-ahead child's bound: the exact search's set-up takes it)
            bounds.append(vb)
            if not math.isfinite(vb.total_s):
                continue
            if best is not None and vb.total_s >= best[0]:  # eq. DP8f: no plan of v beats the best (eq. B2)
                skipped += 1
                continue
            # (the lambda reads ``best`` as it is when the second pass comes: late binding is the point)
            for ri, charge in _passes(problem, look, lambda: best[0] if best is not None else math.inf,  # noqa: B023
                                      cross.on):
                if best is not None and dl.expired() and not look.made(ri, charge):
                    stopped = True
                    break
                ahead += look.made(ri, charge)
                run = look.run(problem, ri, charge)
                tried += run.splits
                if run.regraded and (v not in raw or run.found[0] < raw[v][0]):
                    raw[v] = run.found
                got = run.graded
                cross.saw(charge is not None, got)
                if got is not None and (v not in found or got[0] < found[v][0]):
                    found[v] = got
                if got is not None and (best is None or got[0] < best[0]):
                    best = got
            cross.next_variant()
            if phase is plain and _past_the_best(problem, plain, found, v, best):
                rose = True
                break
    stats = {"splits": tried, "variants_skipped_by_bound": skipped, "runs_ahead": ahead}
    if rose:
        stats["stopped"] = "past the best micro-batch (eq. DP8g)"
    if stopped:
        stats["stopped"] = "interrupted" if dl.interrupted else "deadline"
    if best is None and any(math.isfinite(b.total_s) for b in bounds):
        # variants by their bound (eq. B2), lowest first: on Sailor's OPT-350M profile rows under eq. Q2 (the segment
        # DP covers no option there) index order reached 25.7 / 30.2 / 30.2 s plans in its 1 s, this order 5.03 /
        # 2.88 / 1.81 s (32+96 / 80+240 / 128+384 GPUs; the searches' optima 5.03 / 2.73 / 1.71 s)
        searched = (plain + copies)[:len(bounds)]  # bounds[i] is variant searched[i]'s
        order = [searched[i] for i in sorted(range(len(bounds)), key=lambda i: bounds[i].total_s)]
        order += [v for v in plain + copies if v not in set(order)]
        a = beam_search(problem, time_limit_s=min(TIME_LIMIT_S, max(dl.remaining(), 0.1)), order=order)
        stats["fallback"] = "beam"
        best = (evaluate(problem, a), a) if a is not None else None
    if best is None:
        wall = time.perf_counter() - t0
        if all(not math.isfinite(b.total_s) for b in bounds):
            return RawResult("INFEASIBLE", "dp", wall_time_s=wall, message=infeasibility_reason(problem, bounds),
                             stats=stats)
        return RawResult("NO_SOLUTION", "dp", wall_time_s=wall, message="the DP heuristic found no plan", stats=stats)
    if best is not polished:  # eqs. LS1, LS2 (the move budget: common/polish.py)
        top = _polish_top(problem, list(found.values()) or [best], raw=raw, threads=threads)
        best = min((b for b in (polished, top) if b is not None), key=lambda b: b[0])
    a = best[1]
    a = canonical(problem, build_tables(problem, a.variant), a)
    return RawResult("FEASIBLE", "dp", assignment=a, objective_s=evaluate(problem, a), bound_s=None,
                     wall_time_s=time.perf_counter() - t0, stats=stats)  # (the polish included)


@dataclass(frozen=True)
class _Run:
    """One coverage-DP run (eqs. DP1-DP5) on a variant and restriction: its plan as found, the plan the loop keeps
    (regraded by eq. LS2b when ``regraded``) and the splits it tried."""

    found: tuple[float, Assignment] | None
    graded: tuple[float, Assignment] | None
    regraded: bool
    splits: int


@dataclass
class _Look:
    """Variant ``v`` as the DP's loop reads it: its bound (eq. B2), what eq. DP8b's charge reads of its tables
    (``links``: p2p, vpp, M), its restrictions (eqs. U1/U2) and the runs made so far, by (restriction, charge)."""

    v: int
    vb: object
    links: SimpleNamespace
    restrictions: int
    runs: dict = field(default_factory=dict)
    tables: Tables | None = None  # (built where they are needed; not sent between processes)
    # eq. DP8i: under eq. U1 each restriction's eq. B2 bound (its own options' tables), and the restrictions in
    # ascending order of it (None: in index order, no bound)
    bounds: list[float] | None = None
    order: list[int] | None = None

    @classmethod
    def of(cls, problem: Problem, v: int) -> _Look:
        t, vb = root_setup(problem, v)  # (memoised: the exact search's set-up takes them from here)
        return cls(v, vb, SimpleNamespace(p2p=t.p2p, vpp=t.vpp, M=t.M), len(_restrictions(problem, t)), tables=t)

    def ranked(self, problem: Problem) -> list[int]:
        """The restrictions in the order the loop runs them: eq. DP8i's under eq. U1 (``bounds`` and ``order`` set
        on first use, only for a variant the loop searches), else index order."""
        if self.order is None and problem.uniform and self.restrictions > 1 and USE_SIGNATURE_BOUND:
            if self.tables is None:
                self.tables = root_setup(problem, self.v)[0]
            # (a signature's bound over all its options bounds each restriction of it, eq. U1's one per signature)
            by_sig = signature_bounds(problem, self.tables)
            self.bounds = [by_sig[int(s)].total_s for s in np.unique(self.tables.sig)]
            self.order = sorted(range(self.restrictions), key=lambda i: (self.bounds[i], i))
        return list(range(self.restrictions)) if self.order is None else self.order

    def made(self, ri: int, charge: np.ndarray | None) -> bool:
        return (ri, None if charge is None else charge.tobytes()) in self.runs

    def run(self, problem: Problem, ri: int, charge: np.ndarray | None) -> _Run:
        """The run at restriction ``ri`` with ``charge`` (None: the first pass, eq. DP1, without dominated islands),
        made here unless made already (eq. PAR5b's look-ahead: the same run, so the same result)."""
        key = (ri, None if charge is None else charge.tobytes())
        if key not in self.runs:
            if self.tables is None:
                self.tables = root_setup(problem, self.v)[0]
            t = self.tables
            r = _restrictions(problem, t)[ri]
            got, n = _variant(problem, t, r if charge is not None else _kept(problem, t, r), self.vb.rest_lb, charge)
            if got is not None and USE_REGRADE and not violations(problem, got[1]):
                self.runs[key] = _Run(got, regrade(problem, got[1], got[0]), True, n)
            else:
                self.runs[key] = _Run(got, got, False, n)
        return self.runs[key]


def _passes(problem: Problem, look: _Look, best: Callable[[], float],
            cross: Callable[[], bool] = lambda: True) -> Iterator[tuple[int, np.ndarray | None]]:
    """The runs of a variant in the loop's order: per restriction the first pass (charge None, eq. DP1), then eq.
    DP8b's second pass on several islands at the charge ``best()`` (the best objective so far, read after the first
    pass) gives, where it gives one and ``cross()`` (eq. DP8j) allows it."""
    for ri in look.ranked(problem):
        if look.bounds is not None and look.bounds[ri] >= best():
            return  # eq. DP8i: this signature's plans, and those of every later one, are no better than the best
        yield ri, None
        charge = _cross_charge(problem, look.links, best(), look.vb.rest_lb) if cross() else None
        if charge is not None:
            yield ri, charge


@dataclass
class _CrossTrial:
    """Eq. DP8j: whether DP8b's second passes still run: they stop after CROSS_TRIAL variants in a row whose second
    pass gave no plan better than their first pass (``saw`` each run's plan, ``next_variant`` after each variant)."""

    idle: int = 0
    first: float = math.inf
    second: float | None = None  # None: no second pass on this variant

    def on(self) -> bool:
        return CROSS_TRIAL is None or self.idle < CROSS_TRIAL

    def saw(self, crossing: bool, got: tuple[float, Assignment] | None) -> None:
        obj = got[0] if got is not None else math.inf
        if crossing:
            self.second = min(obj, math.inf if self.second is None else self.second)
        else:
            self.first = min(self.first, obj)

    def next_variant(self) -> None:
        if self.second is not None:
            self.idle = 0 if self.second < self.first else self.idle + 1
        self.first, self.second = math.inf, None


def _look_ahead(problem: Problem, phase: list[int], best, threads: int) -> dict[int, _Look]:
    """Eq. PAR5b: the variants of ``phase`` looked at on two processes (the even positions here, the odd ones on a
    forked child), each process walking its share in order from ``best`` (the best plan known at the phase's start)
    as the loop would, but with only its own plans: eq. DP8f's skips and eq. DP8b's charges follow its own best. The
    loop takes a run from it only where it is the run the loop makes (the same variant, restriction and charge) and
    makes any other itself, so it makes the same runs in the same order and keeps the same plans as without the
    look-ahead. Nothing where ``fork_map`` would not fork (one thread, one CPU, in a forked child). Eq. PAR5e
    (``SHARE_LOOK_AHEAD``): the two processes take the variants in turn from one shared list as each becomes free,
    not in fixed halves (the loop's runs and plans stay the same either way)."""
    if not forks(threads, len(phase)):
        return {}
    dl = current()
    queue = shared_queue() if SHARE_LOOK_AHEAD else None

    def walk(share: list[int]) -> dict[int, _Look]:
        mine, got, cross = best, {}, _CrossTrial()  # (eq. DP8j over this share's variants)
        for v in taken(phase if queue is not None else share, queue):
            if mine is not None and dl.expired():
                break
            look = got[v] = _Look.of(problem, v)
            if not math.isfinite(look.vb.total_s) or (mine is not None and look.vb.total_s >= mine[0]):
                continue
            for ri, charge in _passes(problem, look, lambda: mine[0] if mine is not None else math.inf,  # noqa: B023
                                      cross.on):
                g = look.run(problem, ri, charge).graded
                cross.saw(charge is not None, g)
                if g is not None and (mine is None or g[0] < mine[0]):
                    mine = g
            cross.next_variant()
        for look in got.values():  # (not sent back: the loop rebuilds a variant's tables only for a run it lacks)
            look.tables = None
        return got

    seen: dict[int, _Look] = {}
    for got in fork_map(walk, [phase[0::2], phase[1::2]], threads, stop=lambda: dl.interrupted,
                        interrupt=dl.interrupt):
        seen.update(got)
    return seen


def _past_the_best(problem: Problem, plain: list[int], found: dict, v: int, best) -> bool:
    """Eq. DP8g: the plain variants, one per micro-batch in ascending order, stop once a variant's DP plan is both
    slower than the previous variant's and more than ``STOP_RISE`` above the best: past the best micro-batch the bubble
    only grows. Only the warm start's search stops (the exact search still bounds every variant)."""
    if STOP_RISE is None or best is None or v not in found or plain.index(v) == 0:
        return False
    batches = [problem.variants[w].samples_per_microbatch for w in plain]
    if any(b <= a for a, b in itertools.pairwise(batches)):
        return False
    u = plain[plain.index(v) - 1]
    return u in found and found[v][0] > found[u][0] and found[v][0] > (1 + STOP_RISE) * best[0]


def _polish_top(problem: Problem, found, k: int = POLISH_TOP, raw: dict | None = None,
                threads: int = 1) -> tuple[float, Assignment] | None:
    """Eq. LS2: the ``k`` lowest of ``found`` (a dict variant -> (objective, plan), or a list of them), and of ``raw``
    (the same before eq. LS2b's regrading) the ``k`` lowest not among them, polished in
    turn, ``POLISH_CHUNK`` candidate plans each, the lowest first (eq. LS3a), until each is done (eq. LS1: its
    local optimum or move budget) or the deadline passes; the best one. Without a deadline this is LS1 on each."""
    plans = sorted(found.values() if isinstance(found, dict) else found, key=lambda b: b[0])[:k]
    seen = {a for _, a in plans}
    plans += [b for b in sorted((raw or {}).values(), key=lambda b: b[0])[:k] if b[1] not in seen]
    if not plans:
        return None
    dl = current()

    def walk(share: list) -> list[tuple[float, Assignment]]:  # (each process's runs in turn, eq. LS3a)
        runs = [Polish(problem, a) for a in share]
        while not all(r.done for r in runs):
            for r in runs:
                r.step(POLISH_CHUNK)
            if dl.expired():
                break
        return [(r.best_obj, r.best) for r in runs]

    # eq. PAR5: two shares of the starts on two processes (each walk ends as it does alone: the same plans unless the
    # deadline cuts them); in one process, one walk over all of them (eq. LS3a's order across every start)
    starts = [a for _, a in plans]
    if forks(threads, len(starts)):
        ends = [None] * len(starts)
        ends[0::2], ends[1::2] = fork_map(walk, [starts[0::2], starts[1::2]], threads, stop=lambda: dl.interrupted,
                                          interrupt=dl.interrupt)
    else:
        ends = walk(starts)
    _obj, a = min(ends, key=lambda e: e[0])  # (the first of equals, as one process would)
    return evaluate(problem, a), a


def _copy_rank(problem: Problem, a: Assignment, w: int) -> tuple:
    """Eq. DP7's order of the interleaved copies: those of plan ``a``'s micro-batch first, then by how far their
    stage count is from ``a``'s, index last (deterministic). On qwen3-235b-a22b x hetero3-4096 (gbs 2048) the best
    copy the DP finds is one of the plain best's micro-batch (vpp 4, P 32 against P 24)."""
    var, base = problem.variants[w], problem.variants[a.variant]
    return (var.samples_per_microbatch != base.samples_per_microbatch, abs(var.num_stages - len(a.stages)), w)


def _seed_copies(problem: Problem, a: Assignment, copies: list[int]) -> tuple[float, Assignment] | None:
    """Eq. DP7: the vpp = 1 plan ``a``'s stages on each interleaved copy of its micro-batch, reshaped to the copy's
    stage count (eq. I5 fixes P per copy; ``_reshape``); the best feasible one by ``evaluate``, or None. One check
    per copy."""
    base = problem.variants[a.variant]
    best = None
    for w in copies:
        var = problem.variants[w]
        if var.samples_per_microbatch != base.samples_per_microbatch:
            continue
        cand = Assignment(w, _reshape(a.stages, var.num_stages))
        if violations(problem, cand):
            continue
        obj = evaluate(problem, cand)
        if best is None or obj < best[0]:
            best = (obj, cand)
    return best


def _reshape(stages: tuple, p: int) -> tuple:
    """``stages`` made ``p`` long: merge the neighbouring pair with the fewest layers (the first one's option, so
    the GPUs used only drop), or split the stage with the most layers in two with its option (more GPUs: the
    check may reject it). The local search (eq. LS1) rebalances what this leaves."""
    st = list(stages)
    while len(st) > p:
        j = min(range(len(st) - 1), key=lambda i: st[i].num_layers + st[i + 1].num_layers)
        st[j:j + 2] = [Stage(st[j].option, st[j].num_layers + st[j + 1].num_layers)]
    while len(st) < p:
        j = max(range(len(st)), key=lambda i: st[i].num_layers)
        if st[j].num_layers < 2:
            break
        h = st[j].num_layers // 2
        st[j:j + 1] = [Stage(st[j].option, st[j].num_layers - h), Stage(st[j].option, h)]
    return tuple(st)


def _cross_charge(problem: Problem, t: Tables, best: float, rest_lb: float) -> np.ndarray | None:
    """Eq. DP8b: the links' charges on a stage's budget for the DP's second pass, or None (no second pass). The
    first pass (DP1, DP2) charges every link its whole time to the one stage that sends it, a sufficient condition for
    eq. T2 that shuts a slow link between islands out (its stage must fit in tau - c), while the link's own terms in
    T2 are c/2 <= tau and its share of the in-flight round trips, c over the stages below it. On a cluster of several
    islands (group names ``type@island``) the second pass charges a link between two islands ``CROSS_SHARE`` of its
    time when a plan across it can beat ``best`` (eq. DP5's window: (M - 1) c/2 + rest_lb < best, tau >= c/2); with
    no such link there is no second pass. The plans are scored by ``evaluate`` either way."""
    blocks = problem.group_island
    if blocks.max(initial=0) == 0 or CROSS_SHARE >= 1:
        return None
    own = np.full(t.p2p.shape[0], -1)
    own[:len(blocks)] = blocks  # (endpoints past the groups: mixed options, outside this DP)
    cross = (own[:, None] != own[None, :]) & (own[:, None] >= 0) & (own[None, :] >= 0)
    if t.vpp <= 1:  # (eq. I2's period under interleaving: not filtered)
        cross &= (t.M - 1) * t.p2p / 2 + rest_lb < best
    if not cross.any():
        return None
    return np.where(cross, CROSS_SHARE * t.p2p, t.p2p)


def _restrictions(problem: Problem, t: Tables) -> list[Restriction]:
    """U1: one run per (tp, dp, recompute) signature; U2: one run per tp of the pipeline ends."""
    # mixed options (eq. H1) span groups: outside the group-segment DP (beam search covers them); eq. Q2's (group, tp)
    # endpoints are in, their links charged by group (core.group_links)
    every = owners(t) >= 0
    if problem.uniform:
        return [Restriction((t.sig == s) & every, (t.sig == s) & every) for s in np.unique(t.sig)]
    if problem.same_tp_first_last:
        return [Restriction(every, t.tp == p) for p in np.unique(t.tp)]
    return [Restriction(every, every)]


def _kept(problem: Problem, t: Tables, r: Restriction) -> Restriction:
    """Eq. DP8h: the first pass (every link charged whole, eq. DP1) without the options of islands another island
    dominates (``island_split.kept_islands``, eq. N9b): each plan inside such an island has a twin inside the other
    that is no slower, and the first pass's plans stay inside one island; eq. DP8b's second pass, which prices plans
    across islands, keeps every island. Measured (the DP alone, no deadline): the same plans, llama3-70b x 3 types x 2
    islands 4.76 -> 3.61 s on 1024 GPUs, 2.85 -> 1.59 s on 4096 (formulations/dp.md)."""
    own = island_split.option_islands(problem, t)
    if own is None:
        return r
    keep = np.isin(own, sorted(island_split.kept_islands(problem, t.v)))
    return Restriction(r.every & keep, r.ends & keep)


def _candidates(t: Tables, r: Restriction) -> np.ndarray:
    """Every value at which some stage capacity changes: n * layer_time + extras + outgoing link
    (eq. DP1), and the link values themselves."""
    lt, ft, xt = t.coef["layer_time"][r.every], t.coef["first_time"][r.every], t.coef["last_time"][r.every]
    hmax = t.U_mem[:, r.every].max(axis=0) if t.n else np.zeros(0)
    n = np.arange(1, t.L + 1)
    links = np.unique(np.concatenate([[0.0], t.p2p.ravel()]))
    base = np.unique(np.concatenate([(n[None, :] * lt[:, None] + e[:, None])[n[None, :] <= hmax[:, None]]
                                     for e in (0 * ft, ft, xt, ft + xt)]))
    return np.unique(np.concatenate([(base[None, :] + links[:, None]).ravel(), t.p2p.ravel() / 2]))


def _feasible(problem: Problem, t: Tables, r: Restriction, cls, tau: float, charge: np.ndarray) -> tuple:
    """(eq. DP3's structures at ``tau``, the CapCache they were built on): empty structures where L layers do not fit."""
    caps_at = CapCache(t, r, cls)
    return coverage(t, cls, caps_at, problem.group_capacity, tau, MAX_SEGMENTS, charge), caps_at


# eq. DP3b: the least feasible tau of the variants' runs last found in this process (at most HINTS). A test point
# only: the search tries the candidate equal to a hint and its neighbour below first, then bisects what is left, and
# by eq. DP3's monotonicity ends at the same least tau whatever the hints (so the same plans on every run and process)
HINTS = 2
_recent: list[float] = []


def _least_tau(problem: Problem, t: Tables, r: Restriction, cls, cand: np.ndarray, charge: np.ndarray):
    """Eq. DP3b: (index of the least candidate tau whose structures hold L layers, (structures, CapCache) there), or
    None when none does. Bisection over ``cand`` (ascending), each test one ``coverage`` call, after the recent least
    taus: variants that differ in their micro-batch count only often share it (measured: mixtral-8x7b x hetero3-4096,
    35 runs in triples of one least tau; 15-16 bisection tests a run, 2 where the hint holds)."""
    known: dict[int, tuple] = {}

    def test(i: int) -> bool:
        if i not in known:
            known[i] = _feasible(problem, t, r, cls, float(cand[i]), charge)
        return bool(known[i][0])

    lo, hi = 0, len(cand) - 1
    for h in reversed(_recent):
        i = int(np.searchsorted(cand, h))
        if not lo <= i <= hi or cand[i] != h:
            continue
        if not test(i):
            lo = i + 1
        elif i == lo or not test(i - 1):
            lo = hi = i
            break
        else:
            hi = i - 1
    if lo > hi or (hi == len(cand) - 1 and not test(hi)):
        return None
    while lo < hi:  # (eq. DP3 is monotone in tau)
        mid = (lo + hi) // 2
        if test(mid):
            hi = mid
        else:
            lo = mid + 1
    tau = float(cand[lo])
    if HINTS:  # (0: no hints, plain bisection; one slice assignment, so two solves on two threads cannot trip on it)
        _recent[:] = ([x for x in _recent if x != tau] + [tau])[-HINTS:]
    return lo, known[lo]  # (every bracket end the search kept was tested)


def _variant(problem: Problem, t: Tables, r: Restriction, rest_lb: float, charge=None):
    """Best (objective, assignment) of one variant and restriction, and the number of splits; ``charge``: the
    links' budget charges by endpoint (eq. DP8b; default their times, eq. DP1), charged by group (``group_links``)."""
    cls = option_classes(t, r)
    if not len(cls.members):
        return None, 0
    charge = group_links(t, r.every, t.p2p if charge is None else charge)
    cand = _candidates(t, r)
    least = _least_tau(problem, t, r, cls, cand, charge) if cand.size else None
    if least is None:
        return None, 0
    lo, made = least  # smallest tau with a structure holding L layers (eq. DP3b)
    best, splits = _try_tau(problem, t, r, cls, float(cand[lo]), None, charge, made)
    splits_total = splits
    if best is not None and t.M > 1:  # eq. DP5: larger tau only pays while (M-1)*tau < best - rest_lb
        window = (best[0] - rest_lb) / (t.M - 1)
        above = np.flatnonzero((cand > cand[lo]) & (cand <= window))
        for j in above[np.linspace(0, len(above) - 1, min(EXTRA_TAUS, len(above))).astype(int)] if len(above) else []:
            if current().expired():
                break
            best, splits = _try_tau(problem, t, r, cls, float(cand[j]), best, charge)
            splits_total += splits
    return best, splits_total


def _try_tau(problem: Problem, t: Tables, r: Restriction, cls, tau: float, best, charge: np.ndarray, made=None):
    """``made``: ``_feasible``'s (structures, CapCache) at ``tau`` when the caller has them."""
    structures, caps_at = made or _feasible(problem, t, r, cls, tau, charge)
    ps = sorted(structures)
    pick = sorted({ps[int(i)] for i in np.linspace(0, len(ps) - 1, min(MAX_P_PER_TAU, len(ps)))}) if ps else []
    for p in pick:
        stages = split(t, cls, structures[p][1], caps_at, tau, charge)
        if stages is None:
            continue
        a = Assignment(t.v, tuple(Stage(int(t.opts[i]), n) for i, n in reversed(stages)))
        if violations(problem, a):
            log.debug("dp: split produced an infeasible plan %s", a)
            continue
        obj = evaluate(problem, a)
        if best is None or obj < best[0]:
            best = (obj, a)
    return best, len(pick)
