"""Local search on a plan (eq. LS1 of formulations/dp.md): the DP heuristic's last step and the
exact solvers' incumbent improver.

Moves, each kept only if the plan stays feasible (``problem.violations``) and ``evaluate``
drops: the stages in another order (eq. LS1d: the middle stages by their DP sync, then two neighbours swapped);
change one stage's option; move one layer to another stage; split a stage in two with
the same option; merge two neighbouring stages into one with either option; every stage's option regraded on
the same GPUs against a cap on its sync (eq. LS1e); on an interleaved copy (a fixed stage count) one stage split in
two and two stages of one group merged in one candidate (eq. LS1f, ``exchange_moves.py``); the same stages under
another micro-batch variant (eq. LS1b: another micro-batch count or vpp). First
improvement, deterministic order, stopped at a local optimum or after ``max_moves`` candidate
plans (a count, not a clock: the same input gives the same plan whatever the machine's load).
"""

from __future__ import annotations

import math

import numpy as np

from haap_milp.deadline import current
from haap_milp.pipeline import exposed_sync, interleaved_tau_weight, sigma_share, sync_share
from haap_milp.problem import Assignment, Problem, Stage, evaluate, stage_sum, stage_times, sync_times, violations
from haap_milp.solvers.common.exchange_moves import exchange_moves

# candidate plans per call. Measured (synthetic instances of tests/synthetic.py, 40 small and six of
# 256/1024 GPUs): from the raw DP plan the search reached its local optimum after at most 4,912
# candidates (median 23), one candidate costing 30-100 us (idle to loaded machine), so 10,000 is twice
# the worst case and about the 0.2-0.3 s the clock budget it replaces allowed on an idle machine
MAX_MOVES = 10_000
USE_VARIANT_MOVES = True  # eq. LS1b: the stages moved to another micro-batch variant, after the other moves
USE_ORDER_MOVES = True  # eq. LS1d: the stages reordered, before the other moves
# eq. LS1e: every stage's option regraded along the pipeline against a cap on its DP sync, GRADE_CAPS caps from
# 1/GRADE_CAPS to all of the plan's largest sync, at a local optimum of the other moves (before the variant moves)
USE_GRADE_MOVES = True
GRADE_CAPS = 20
# eq. LS1f (exchange_moves.py): one stage split in two and two stages of one group merged, the stage count kept, at a
# local optimum of the moves before it (after LS1e, before LS1b); on every variant or only where the stage count is
# fixed (interleaved copies, eq. I5), where LS1's own split and merge leave the variant
USE_EXCHANGE_MOVES = True
EXCHANGE_FIXED_P_ONLY = True
# eq. LS1g: ``_no_better``'s screen for all of a plan's option moves of one stage at once (numpy) and for its layer
# moves from its stage times, before a candidate plan is built; a candidate the screen rules out by more than
# SCREEN_MARGIN (relative) is counted as tried and never built, any other goes through ``_feasible_better`` as before
FAST_SCREEN = True
SCREEN_MARGIN = 1e-9
# eq. LS1h: ``_no_better`` adds the candidate's exposed sync (sigma of eqs. T3 / I1) to its bound before ``evaluate``
SCREEN_SIGMA = True
# eq. LS1i: eq. LS1g's screen also claims the option moves whose GPUs, with the other stages', exceed a group (eq. G1)
SCREEN_GPUS = True


def _feasible_better(problem: Problem, a: Assignment, best: float) -> float | None:
    if not a.stages or len(a.stages) > problem.max_stages or any(s.num_layers < 1 for s in a.stages):
        return None
    if _no_better(problem, a, best * (1 - 1e-12)):
        return None
    obj = evaluate(problem, a)
    if obj < best * (1 - 1e-12) and not violations(problem, a):
        return obj
    return None


def _no_better(problem: Problem, a: Assignment, limit: float) -> bool:
    """True when the candidate's T cannot be below ``limit``: under 1F1B without eq. EX1's terms, T = (M - 1) tau +
    sum t + sum c + sigma with tau >= max t and sum c >= 0 (eqs. T1-T3), so (M - 1) max t + sum t (+ sigma, eq. LS1h),
    formed from the same stage times and sync times and added in the same order, is at most ``evaluate``'s value in
    floating point too (rounding is monotone, and sigma is the same ``exposed_sync`` of the same lists); interleaved
    (eq. I1), T_v = (M - 1/vpp) tau_v + sum t / vpp + (links >= 0) + sigma_v with tau_v >= max t, so
    (M - 1/vpp) max t + sum t / vpp (+ sigma_v) likewise. A screen only (the candidate counts as tried either way): it
    skips ``evaluate`` (~30 us; ~45 us interleaved) and ``violations`` for the many option and layer moves whose slowest
    stage, or whose slowest stage and exposed sync, rule them out, at the price of ``stage_times`` and ``sync_times``
    (~5 us each)."""
    v = problem.variants[a.variant]
    if v.extra is not None:
        return False
    t = stage_times(problem, a)
    if v.vpp > 1:
        bound = interleaved_tau_weight(v.num_microbatches, v.vpp) * max(t) + sum(t) / v.vpp
    else:
        bound = (v.num_microbatches - 1) * max(t) + sum(t)
    if bound >= limit:
        return True
    if not SCREEN_SIGMA:
        return False
    # eq. LS1h: sigma as eqs. T3 / I1 form it (blocking applies to 1F1B only, as in ``time_of``)
    sigma = exposed_sync(t, sync_times(problem, a), sigma_share(v.vpp, problem.p2p_blocking and v.vpp <= 1))
    return bound + sigma >= limit


def _order_moves(problem: Problem, a: Assignment):
    """Eq. LS1d: the same stages in another order. sigma of eqs. T3/I1 is max_j (s_j - beta * sum_{k<j} t_k): for
    two neighbours with s_j <= s_{j+1} each of their terms is at most s_{j+1} less the same offset, which the swapped
    order has, so the middle stages by ascending sync are least in sigma (the ends keep their embedding and head).
    Order also moves eq. T2's round trips and each stage's in-flight memory, so the sorted order is only a
    candidate, then every swap of two neighbours. Measured: gpt3-13b x hetero3-4096 (gbs 1024, vpp searched), the
    optimum (0.4783 s) alternates A100-40GB and H100 stages by sync; the same stages grouped by type: 0.4917 s."""
    st = a.stages
    if len(st) > 3:
        s = sync_times(problem, a)
        mid = sorted(range(1, len(st) - 1), key=lambda j: s[j])  # stable: ties keep their order
        if mid != list(range(1, len(st) - 1)):
            yield Assignment(a.variant, (st[0],) + tuple(st[j] for j in mid) + (st[-1],))
    for j in range(len(st) - 1):
        if st[j] != st[j + 1]:
            yield Assignment(a.variant, st[:j] + (st[j + 1], st[j]) + st[j + 2:])


def _grade_moves(problem: Problem, a: Assignment):
    """Eq. LS1e: each stage's option replaced by one on the same GPUs (``Problem.same_gpus``: another ep, tp,
    recompute, ZeRO stage or cp), graded along the pipeline. sigma of eqs. T3/I1 is max_j (s_j - beta * sum_{k<j}
    t_k), so a stage late in the pipeline may sync longer than an early one. For a cap S on sigma, stage j takes the
    fastest alternative whose sync is at most S + beta * (the chosen times before it), or the least-sync one when
    none is; one candidate per cap. One option at a time moves one stage and cannot lower a max that several stages
    hold (eq. LS1's option move), nor can a swap of one option on every stage, which is too slow early or too
    slow to sync late. Measured: qwen3-235b-a22b x hetero3-4096 (gbs 2048, what ``solve`` searches), the DP
    heuristic gave every A100-80GB stage ep 8 (58 ms for 5 layers, a 428 ms expert-gradient sync): 2.5187 s; graded
    at a cap of 1/4 of the largest sync 2.4187 s, polished 2.3779 s (CP-SAT's best in 60 s: 2.4123 s)."""
    v = problem.variants[a.variant]
    alts = {o: [x for x in problem.same_gpus[o] if v.allowed[x]] for o in dict.fromkeys(s.option for s in a.stages)}
    if all(len(x) < 2 for x in alts.values()):
        return
    t_of, s_of = {}, {}  # (option, alternative) -> per position the stage time and sync with that alternative
    for o, xs in alts.items():
        for x in xs:
            b = Assignment(a.variant, tuple(Stage(x, s.num_layers) if s.option == o else s for s in a.stages))
            t_of[o, x], s_of[o, x] = stage_times(problem, b), sync_times(problem, b)
    beta = sync_share(problem.p2p_blocking) / max(1, v.vpp)  # the model's sigma slope (eqs. T3, I1)
    top = max(sync_times(problem, a))
    seen, found = {a.stages}, []
    for i in range(1, GRADE_CAPS + 1):
        cap, before, out = top * i / GRADE_CAPS, 0.0, []
        for j, st in enumerate(a.stages):
            xs = alts[st.option]
            ok = [x for x in xs if s_of[st.option, x][j] <= cap + beta * before]
            x = (min(ok, key=lambda x: t_of[st.option, x][j]) if ok
                 else min(xs, key=lambda x: s_of[st.option, x][j]))
            out.append(Stage(x, st.num_layers))
            before += t_of[st.option, x][j]
        if tuple(out) not in seen:
            seen.add(tuple(out))
            found.append(Assignment(a.variant, tuple(out)))
    # best first (first improvement would take the first cap that gains; measured on the plan above, the caps' plans
    # polished to 2.3779 s from the best one, 2.4103 s from the first)
    yield from sorted(found, key=lambda c: evaluate(problem, c))


def regrade(problem: Problem, a: Assignment, obj: float | None = None) -> tuple[float, Assignment]:
    """Eq. LS2b: (T, plan) of the best feasible candidate of eq. LS1e that beats ``a``, else ``a``'s own (``a``
    feasible; ``obj``: its T when known)."""
    best = (evaluate(problem, a) if obj is None else obj, a)
    for c in _grade_moves(problem, a):
        obj = evaluate(problem, c)
        if obj >= best[0] * (1 - 1e-12):
            break  # (best first: no later candidate beats it)
        if not violations(problem, c):
            return obj, c
    return best


class _Screen:
    """Eq. LS1g: ``_no_better``'s bound, (M - 1) max t + sum t (interleaved: (M - 1/vpp) max t + sum t / vpp), for the
    option and layer moves of plan ``a`` from a's stage times: a move changes one stage's time (option) or two
    (layer), whose new values are the same products and sums ``stage_times`` forms. Only the running sum is added in
    another order, so ``out`` claims a candidate only where its bound passes ``limit`` by SCREEN_MARGIN (relative),
    far above that rounding (about p ulps): every candidate it claims, ``_no_better`` rules out too, and the walk
    tries the same plans in the same order (tested: the same plans and counts with it off). ``on`` is False where
    ``_no_better`` screens nothing (eq. EX1's terms) or FAST_SCREEN is off. Eq. LS1i (``gpus``): an option move is
    also claimed where the plan's other stages and the new option take more GPUs of a group than it has, which
    ``violations`` would refuse (eq. G1; integers, so exact on any costs)."""

    def __init__(self, problem: Problem, a: Assignment, limit: float):
        v = problem.variants[a.variant]
        self._gathered: tuple = (None,)
        # eq. LS1i: GPUs per group of the plan and of each option (integers: exact whatever the costs' type)
        self.gpus = FAST_SCREEN and SCREEN_GPUS
        if self.gpus:
            self.use, self.cap = problem.usage_matrix, np.asarray(problem.group_capacity, np.int64)
            self.used = self.use[[st.option for st in a.stages]].sum(axis=0)
        # (float64 costs only, ``Variant.cost_lists``: in float32 ``stage_times`` rounds far more than SCREEN_MARGIN)
        self.on = FAST_SCREEN and v.extra is None and v.cost_lists is not None
        if not self.on:
            return
        self.t = stage_times(problem, a)
        self.total = sum(self.t)
        self.w, self.div = ((interleaved_tau_weight(v.num_microbatches, v.vpp), v.vpp) if v.vpp > 1
                            else (v.num_microbatches - 1, 1))
        self.limit = limit * (1 + SCREEN_MARGIN)
        self.per, self.first, self.last = v.cost_lists[:3]
        self.arrays = tuple(np.asarray(x, float) for x in (v.layer_time, v.first_time, v.last_time))
        self.top = sorted(range(len(self.t)), key=lambda j: -self.t[j])[:3]  # the three slowest stages

    def _max_without(self, *js: int) -> float:
        return next((self.t[k] for k in self.top if k not in js), 0.0)

    def _of(self, opts: np.ndarray) -> tuple:
        """(GPUs per group, layer, first and last times) of ``opts``, gathered once for all of a plan's stages."""
        if self._gathered[0] is not opts:
            arrays = tuple(x[opts] for x in self.arrays) if self.on else ()
            self._gathered = (opts, self.use[opts] if self.gpus else None, *arrays)
        return self._gathered[1:]

    def options(self, a: Assignment, j: int, opts: np.ndarray) -> np.ndarray:
        """[len(opts)] True where stage j with that option (its layers kept) is ruled out: by the bound (t_j' as
        ``stage_sum`` forms it, over all the options at once), or (eq. LS1i) by a group's GPUs, which ``violations``
        (eq. G1) would refuse after ``evaluate``."""
        use, *times = self._of(opts)
        over = np.zeros(len(opts), bool)
        if self.gpus:
            others = self.used - self.use[a.stages[j].option]
            over = ((others[None, :] + use) > self.cap[None, :]).any(axis=1)
        if not self.on:
            return over
        per, first, last = times
        n, p = a.stages[j].num_layers, len(a.stages)
        tj = n * per + (first if j == 0 else 0.0) + (last if j == p - 1 else 0.0)
        bound = self.w * np.maximum(self._max_without(j), tj) + (self.total - self.t[j] + tj) / self.div
        return (bound >= self.limit) | over

    def layer(self, a: Assignment, j: int, q: int) -> bool:
        """True where one layer moved from stage j to stage q is ruled out."""
        st, p = a.stages, len(a.stages)
        tj = stage_sum(st[j].option, st[j].num_layers - 1, j == 0, j == p - 1, self.per, self.first, self.last)
        tq = stage_sum(st[q].option, st[q].num_layers + 1, q == 0, q == p - 1, self.per, self.first, self.last)
        bound = self.w * max(self._max_without(j, q), tj, tq) + (self.total - self.t[j] - self.t[q] + tj + tq) / self.div
        return bound >= self.limit


def _option_moves(a: Assignment, opts: np.ndarray, screen: _Screen | None = None):
    """Stage j's option replaced by each other allowed option, stage by stage; None for a candidate ``screen`` rules
    out (eq. LS1g: counted, not built)."""
    use = screen is not None and (screen.on or screen.gpus)
    for j, st in enumerate(a.stages):
        out = screen.options(a, j, opts).tolist() if use else [False] * len(opts)
        for o, ruled_out in zip(opts.tolist(), out):
            if o != st.option:
                yield None if ruled_out else Assignment(a.variant, a.stages[:j] + (Stage(o, st.num_layers),) +
                                                        a.stages[j + 1:])


def _layer_moves(a: Assignment, screen: _Screen | None = None):
    """One layer moved from stage j to stage q; None for a candidate ``screen`` rules out (eq. LS1g)."""
    p = len(a.stages)
    on = screen is not None and screen.on
    for j in range(p):
        if a.stages[j].num_layers < 2:
            continue
        for q in range(p):
            if q == j:
                continue
            if on and screen.layer(a, j, q):
                yield None
                continue
            st = list(a.stages)
            st[j] = Stage(st[j].option, st[j].num_layers - 1)
            st[q] = Stage(st[q].option, st[q].num_layers + 1)
            yield Assignment(a.variant, tuple(st))


def _shape_moves(a: Assignment):
    st = a.stages
    for j, s in enumerate(st):  # split
        for n1 in range(1, s.num_layers):
            yield Assignment(a.variant, st[:j] + (Stage(s.option, n1), Stage(s.option, s.num_layers - n1)) + st[j + 1:])
    for j in range(len(st) - 1):  # merge
        n = st[j].num_layers + st[j + 1].num_layers
        for o in {st[j].option, st[j + 1].option}:
            yield Assignment(a.variant, st[:j] + (Stage(o, n),) + st[j + 2:])


def _variant_moves(problem: Problem, a: Assignment):
    """The same stages under another micro-batch variant (another micro-batch count, or an interleaved copy's vpp):
    the options are the problem's, each variant prices them at its own micro-batch (eq. LS1b)."""
    for v in range(len(problem.variants)):
        if v != a.variant and problem.variants[v].allowed[[s.option for s in a.stages]].all():
            yield Assignment(v, a.stages)


def exchange(problem: Problem, a: Assignment, max_moves: int, rounds: int = 4) -> Assignment:
    """Eq. LS1f from ``a`` (feasible) itself: the first feasible candidate that beats it, polished (eq. LS1, at most
    ``max_moves`` candidates), at most ``rounds`` times; ``a`` when none beats it. For a plan whose polish the move
    budget ended before the local optimum where the walk tries eq. LS1f (an offered plan, ``OFFER_MOVES``)."""
    obj = evaluate(problem, a)
    for _ in range(rounds):
        found = next((c for c in exchange_moves(problem, a, obj) if _feasible_better(problem, c, obj) is not None), None)
        if found is None:
            break
        a = polish(problem, found, max_moves)
        obj = evaluate(problem, a)
    return a


def polish(problem: Problem, a: Assignment, max_moves: int = MAX_MOVES) -> Assignment:
    """A plan no worse than ``a`` (``a`` itself if it is infeasible) after at most ``max_moves``
    candidate plans (fewer when the deadline of ``deadline.current()`` passes: the best so far)."""
    run = Polish(problem, a, max_moves)
    run.step(max_moves)
    return run.best


class Polish:
    """Eq. LS1 as a resumable run: ``step(n)`` tries up to ``n`` more candidate plans from where the last call
    stopped (the same moves, in the same order, as one call of ``polish`` with the summed budget), so several
    plans can be polished in turn (eq. LS3a). ``done``: a local optimum, the deadline or the move budget reached;
    ``optimal``: a local optimum (every move tried on ``best``)."""

    def __init__(self, problem: Problem, a: Assignment, max_moves: int = MAX_MOVES):
        self.problem, self.best, self.max_moves = problem, a, max_moves
        self.tried, self.optimal = 0, False
        self.done = bool(violations(problem, a))  # (an infeasible plan is returned as it is, never evaluated)
        self.best_obj = math.inf if self.done else evaluate(problem, a)
        self._moves = None if self.done else self._walk()

    def _walk(self):
        """Yields after each candidate; first improvement, restarting the move order on each better plan."""
        improved = True
        while improved:
            improved = False
            opts = np.flatnonzero(self.problem.variants[self.best.variant].allowed)  # (a variant move changes them)
            screen = _Screen(self.problem, self.best, self.best_obj * (1 - 1e-12))  # (_feasible_better's limit)
            moves = (_layer_moves(self.best, screen), _option_moves(self.best, opts, screen), _shape_moves(self.best))
            if USE_ORDER_MOVES:
                moves = (_order_moves(self.problem, self.best),) + moves
            if USE_GRADE_MOVES:
                moves += (_grade_moves(self.problem, self.best),)
            if USE_EXCHANGE_MOVES and (self.problem.variants[self.best.variant].num_stages or not EXCHANGE_FIXED_P_ONLY):
                moves += (exchange_moves(self.problem, self.best, self.best_obj),)  # (a generator: lazy)
            if USE_VARIANT_MOVES:
                moves += (_variant_moves(self.problem, self.best),)
            for gen in moves:
                for cand in gen:
                    obj = None if cand is None else _feasible_better(self.problem, cand, self.best_obj)
                    if obj is not None:
                        self.best, self.best_obj, improved = cand, obj, True
                    yield
                    if improved:
                        break
                if improved:
                    break

    def step(self, n: int) -> None:
        dl = current()
        for _ in range(n):
            if self.done:
                return
            if self.tried >= self.max_moves or (self.tried % 64 == 0 and self.tried and dl.expired()):
                self.done = True
                return
            self.tried += 1
            if next(self._moves, StopIteration) is StopIteration:
                self.done = self.optimal = True
