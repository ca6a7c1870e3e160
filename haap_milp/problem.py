"""The plain, solver-facing planning problem (no pydantic, no estimator).

Presolve (``presolve.py``) builds a ``Problem`` from the specs and the estimator; the
solvers (``solvers/``) read only this module. ``evaluate`` is the reference semantics of
the objective and constraints: every solver's objective must equal it for the plan it
returns, and the brute-force oracle enumerates with it. Equation labels refer to
``formulations/README.md``.

Indexing conventions
--------------------
* ``L`` decoder layers, all of the same cost per option (the embedding is charged to the
  first pipeline stage, final norm + LM head + loss to the last stage).
* A *pipeline* is a list of stages in pipeline order ``j = 0 .. P-1``; stage ``j`` has an
  option ``o_j`` and ``n_j >= 1`` decoder layers, ``sum n_j = L``.
* Position from the end ``q_j = P - j`` (1 for the last stage). Under 1F1B stage j holds
  ``min(q_j, M)`` micro-batches of activations in flight (eq. M1).
* Times are seconds, memory bytes, in float. CP-SAT scales them to integers itself.

Objective (eq. T1), for micro-batch variant v with M micro-batches::

    t_j   = n_j * layer_time[o_j] + [j == 0] * first_time[o_j] + [j == P-1] * last_time[o_j]
    c_j   = p2p_time[g(o_j)][g(o_{j+1})]                  (boundary j -> j+1, j < P-1)
    s_j   = sync_fixed[o_j] + n_j * sync_per_layer[o_j]
            + [j == 0] * sync_first[o_j] + [j == P-1] * sync_last[o_j]
    tau   = max( max_j t_j,  max_j c_j / 2,
                 max_{j <= k, P-j < M} (sum_{j<=i<=k} t_i + sum_{j<=i<k} c_i) / (k - j + 1) )   (eq. T2)
    sigma = max_j ( s_j - beta * sum_{k<j} t_k ),  beta = pipeline.BWD_SHARE (2/3)   (eq. T3)
    T     = (M - 1) * tau + sum_j t_j + sum_j c_j + sigma

The closed forms of tau, sigma, T, a_j and mem_j live in ``haap_milp/pipeline.py`` (their one home);
this module assembles t_j, c_j, s_j from the cost arrays and calls them.

tau is the steady-state period; sigma the DP sync left after the first stage's last backward
(a later stage starts its sync earlier, by at least the backward share of the stages before it). Links are pipeline resources: each direction of a boundary
carries half of c_j per micro-batch (activations forward, gradients backward, full duplex).
Under 1F1B stage j keeps at most P - j micro-batches in flight; when it has more than that to
run (M > P - j) each further forward waits for a backward, i.e. for a round trip through the
later stages and links, so by Little's law the period is at least that round trip divided by
P - j (the third term with k = P - 1; it only matters when links are slow, and it is linear when stages are
indexed from the end). A shorter window j..k is a cycle of the 1F1B order too (stage k runs a forward before
the backward the window waits for), carrying k - j + 1 micro-batches; without those windows the closed form
was up to 30 % below the replay where a slow link sits between two full stages. The
event-by-event simulator (simulate.py) measured the older max(t, c) form up to 19% optimistic
on a slow inter-island link and this one within 0.7% on the integration cases.
Memory (eq. M2), per stage::

    mem_j = fixed_mem[o] + n_j * (layer_static_mem[o] + a_j * layer_act_mem[o])
            + [j == 0]   * (first_static_mem[o] + a_j * first_act_mem[o])
            + [j == P-1] * (last_static_mem[o]  + a_j * last_act_mem[o])  <=  mem_capacity[o]
    with a_j = min(P - j, M)

GPUs (eq. G1): ``sum_j usage[o_j][g] <= group_capacity[g]`` for every group; a single-group option uses
``num_gpus`` of its own group, a mixed option (eq. H1) the GPUs of each of its replica types' groups.
Boundaries (eq. T1b) read ``p2p_time`` at the options' *endpoints*: a single-group option's endpoint is its
group, a mixed option's is a row of its own (indices >= G) priced by presolve (eq. H5); under eq. Q1 (per-replica
sends) every option's endpoint is its (group, tp) or replica types' row >= G (eq. Q2), and rows < G are lower bounds.
Budget (eq. W1, optional): ``sum_j weight[o_j] <= limit`` over the chosen stages, integer weights per
option (an hourly price or idle power of the option's GPUs, ``haap_milp/economics.py``); the time
objective is unchanged, so eq. W1 is what the epsilon-constraint sweep of ``frontier.py`` tightens.
Time bound (eq. TX1e, optional): ``T <= max_time_s`` with T of eq. T1 without eq. EX1's terms (the cost and energy
band search under --max-iteration-time / --min-tokens-per-s); ``violations`` refuses a slower plan.
Engine rules: ``uniform`` (every stage the same (tp, dp, recompute, ep) signature, eq. U1) and
``same_tp_first_last`` (tied embeddings under FlagScale, eq. U2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from haap_milp.pipeline import (
    GIB,
    TIME_RTOL,
    fits_memory,
    inflight,
    inflight_1f1b,
    iteration_time,
    sigma_share,
    sync_excess,
)
from haap_milp.pipeline import stage_memory as stage_memory_bytes


@dataclass(frozen=True, order=True)
class Replicas:
    """One replica type of a mixed option (eq. H1): ``count`` replicas of ``tp`` GPUs of ``group``, each
    running ``samples`` samples of every micro-batch."""

    group: int
    tp: int
    count: int
    samples: int


@dataclass(frozen=True)
class Option:
    """One way to run a stage: a GPU group and its parallel degrees, or (``mix``) data-parallel replicas of
    several groups (a mixed option, eq. H1: ``group`` and ``tp`` are the first replica type's, ``dp`` the
    replica count, ``endpoint`` its own row of ``p2p_time``)."""

    group: int  # index into Problem.groups
    tp: int
    dp: int
    ep: int
    recompute: str  # none | selective | full | op
    #: the dimensions eq. U1 makes equal across stages when ``Problem.uniform`` (runtime's ``--uniform``; a
    #: uniform target engine: all three); not part of the option's identity
    uniform_dims: tuple[str, ...] = field(default=("tp", "dp", "recompute", "ep"), compare=False)
    mix: tuple[Replicas, ...] = ()  # empty: a single-group option
    link: int = -1  # its own row/column of Variant.p2p_time (>= len(groups): a mixed option, or eq. Q2); -1: its group's
    zero: int | None = None  # ZeRO stage (eq. Z1; priced into every coefficient); None: the runtime's
    cp: int = 1  # context-parallel degree (eq. CP1): tp*dp*cp GPUs; one cp per variant, so per plan
    etp: int = 1  # expert-tensor-parallel degree (eq. CP4): ep*etp divides tp*dp*cp

    @property
    def num_gpus(self) -> int:
        return sum(r.tp * r.count for r in self.mix) if self.mix else self.tp * self.dp * self.cp

    @property
    def usage(self) -> tuple[tuple[int, int], ...]:
        """(group, GPUs) per group the option uses (eq. G1), groups in first-use order."""
        if not self.mix:
            return ((self.group, self.tp * self.dp * self.cp),)
        out: dict[int, int] = {}
        for r in self.mix:
            out[r.group] = out.get(r.group, 0) + r.tp * r.count
        return tuple(out.items())

    @property
    def endpoint(self) -> int:
        """Row/column of ``Variant.p2p_time`` for boundaries at this stage (eq. T1b, H5; under eq. Q1 every
        option has its own (group, tp) endpoint, eq. Q2)."""
        return self.link if self.link >= 0 else self.group

    @property
    def signature(self) -> tuple:
        """What must be equal across stages for uniform engines (eq. U1): the dimensions in ``uniform_dims`` —
        all of tp, dp, recompute, ep and etp under a uniform target (Megatron-LM and torchtitan build one
        expert-parallel and one expert-tensor-parallel group size), or the runtime's subset. cp needs no entry:
        it is one per variant (eq. CP1)."""
        return tuple(getattr(self, d) for d in self.uniform_dims)


@dataclass(frozen=True)
class Variant:
    """Costs for one micro-batch choice. Arrays are indexed by option (shape ``[O]``),
    ``p2p_time`` by group pair (shape ``[G, G]``)."""

    samples_per_microbatch: int  # B: samples per micro-batch seen by every stage
    num_microbatches: int  # M = global_batch / B
    layer_time: np.ndarray  # s, fwd+bwd of one decoder layer for one micro-batch
    first_time: np.ndarray  # s, extra for the first stage (embedding)
    last_time: np.ndarray  # s, extra for the last stage (final norm, LM head, loss)
    layer_static_mem: np.ndarray  # bytes per layer: weights + grads + optimizer state
    layer_act_mem: np.ndarray  # bytes per layer per in-flight micro-batch
    first_static_mem: np.ndarray
    first_act_mem: np.ndarray
    last_static_mem: np.ndarray
    last_act_mem: np.ndarray
    fixed_mem: np.ndarray  # bytes per stage regardless of layers (framework, buffers)
    mem_capacity: np.ndarray  # usable bytes per GPU (after headroom)
    sync_fixed: np.ndarray  # s, exposed DP sync + optimizer step, per stage
    sync_per_layer: np.ndarray  # s per layer
    sync_first: np.ndarray  # s, embedding grads
    sync_last: np.ndarray  # s, LM head grads
    p2p_time: np.ndarray  # [E, E] s per micro-batch across a boundary (fwd act + bwd grad); endpoints: G groups,
    # then one per mixed option (eq. H5)
    allowed: np.ndarray  # bool [O]: option usable with this variant (dp divides B, fits one layer)
    #: interleaved 1F1B (eqs. I1-I4): model chunks per stage; 1 = plain 1F1B (eqs. T1-T3). A variant with
    #: vpp > 1 also fixes the stage count (eq. I5: num_stages >= 3 dividing M), so eq. I4's in-flight chunks
    #: and eq. I3's round trips are constants per slot and the slot model stays linear
    vpp: int = 1
    num_stages: int = 0  # 0: any (vpp = 1)
    #: linear terms added to T in the objective (eq. EX1; None: the objective is T). The energy and cost band
    #: search of ``frontier.py`` sets them; every solver's objective and ``evaluate`` include them
    extra: ExtraObjective | None = None

    @cached_property  # stage_times / sync_times run per local-search candidate: Python floats, not numpy scalars
    def cost_lists(self) -> tuple[list, ...] | None:
        """(layer_time, first_time, last_time, sync_fixed, sync_per_layer, sync_first, sync_last) as lists of Python
        floats (the same doubles), or None when an array is not float64 (its products would round differently)."""
        arrays = (self.layer_time, self.first_time, self.last_time, self.sync_fixed, self.sync_per_layer,
                  self.sync_first, self.sync_last)
        if any(np.asarray(x).dtype != np.float64 for x in arrays):
            return None
        return tuple(np.asarray(x).tolist() for x in arrays)


@dataclass(frozen=True)
class ExtraObjective:
    """Eq. EX1: ``sum_j (per_stage[o_j] + n_j per_layer[o_j] + [j=0] first[o_j] + [j=P-1] last[o_j]) + const``
    (seconds), added to T. Arrays [O]. Solvers rely on per_layer, first, last >= 0 and on the per-stage sum with
    ``const`` being >= 0 on every feasible plan (their bounds bound T, plus the least per-layer, first and last
    terms), which the band search guarantees with eq. W1's lower row (``Budget.lower``)."""

    per_stage: np.ndarray
    per_layer: np.ndarray
    first: np.ndarray
    last: np.ndarray
    const: float = 0.0


@dataclass(frozen=True)
class Budget:
    """Eq. W1: ``sum_j weight[o_j] <= limit``. ``weight``: int64 [O], one per option, in integer units (exact in
    every solver: CP-SAT needs integer rows); it must not decrease with an option's GPUs inside a group (so
    presolve's outclassed options and eq. D1's time dominance stay sound: both compare options of one group
    that use no more GPUs). ``name``: what it measures, for messages."""

    weight: np.ndarray
    limit: int
    name: str = "budget"
    lower: int = 0  # eq. W1b: sum_j weight[o_j] >= lower (a band of the energy / cost search, eq. EB1)

    def used(self, options) -> int:
        """Left-hand side of eq. W1 for a list of option indices."""
        return int(sum(int(self.weight[o]) for o in options))


@dataclass(frozen=True)
class Problem:
    """Everything a solver needs, nothing more."""

    num_layers: int
    max_stages: int
    groups: tuple[str, ...]  # display names "a100-80g@main"
    group_capacity: tuple[int, ...]  # GPUs available per group
    options: tuple[Option, ...]
    variants: tuple[Variant, ...]
    uniform: bool = False  # eq. U1
    same_tp_first_last: bool = False  # eq. U2
    p2p_blocking: bool = False  # eq. T2b: pipeline sends block their stages (the runtime's, estimator/runtime.py)
    budget: Budget | None = None  # eq. W1 (None: no budget row)
    #: eq. TX1e: T(a) <= max_time_s (s; T of eq. T1 without eq. EX1's terms): --max-iteration-time /
    #: --min-tokens-per-s in the cost and energy band search. None: no bound on T
    max_time_s: float | None = None
    stats: dict = field(default_factory=dict, compare=False)  # presolve statistics

    @property
    def num_options(self) -> int:
        return len(self.options)

    @cached_property  # read by eq. LS1e on every local optimum: built once per problem
    def same_gpus(self) -> tuple[tuple[int, ...], ...]:
        """Per option, the options that use the same GPUs of the same groups (eq. G1's ``Option.usage``), itself
        included, in index order: another tp, ep, recompute, ZeRO stage or cp on the same GPUs."""
        by_use: dict = {}
        for o, opt in enumerate(self.options):
            by_use.setdefault(opt.usage, []).append(o)
        return tuple(tuple(by_use[opt.usage]) for opt in self.options)

    @cached_property  # read per variant's tables (``slot_bounds``) and per local-search plan (eq. LS1i): built once
    def usage_matrix(self) -> np.ndarray:
        """[O, G] int64: the GPUs each option takes of each group (eq. G1, ``Option.usage``); read-only to callers."""
        out = np.zeros((len(self.options), len(self.groups)), np.int64)
        for o, opt in enumerate(self.options):
            for g, n in opt.usage:
                out[o, g] += n
        return out

    @cached_property  # read per search node (eqs. N6, LS4): the names parsed once per problem
    def group_island(self) -> np.ndarray:
        """[G] the island index of each group, from the names ``type@island`` (one home for that parse)."""
        return np.unique([g.rsplit("@", 1)[-1] for g in self.groups], return_inverse=True)[1].reshape(-1)


@dataclass(frozen=True)
class Stage:
    option: int
    num_layers: int


@dataclass(frozen=True)
class Assignment:
    """A solver's answer: a variant and stages in pipeline order."""

    variant: int
    stages: tuple[Stage, ...]


def stage_memory(problem: Problem, a: Assignment) -> list[float]:
    """Peak bytes per GPU of each stage (eq. M2, ``pipeline.stage_memory``; a_j of eq. M1)."""
    v = problem.variants[a.variant]
    p = len(a.stages)
    out = []
    for j, st in enumerate(a.stages):
        o = st.option
        first = (v.first_static_mem[o], v.first_act_mem[o]) if j == 0 else None
        last = (v.last_static_mem[o], v.last_act_mem[o]) if j == p - 1 else None
        a_j = inflight("interleaved", j, p, v.num_microbatches, v.vpp) if v.vpp > 1 else \
            inflight_1f1b(p - j, v.num_microbatches)  # eq. I4 / eq. M1
        mem = stage_memory_bytes(v.fixed_mem[o], v.layer_static_mem[o], v.layer_act_mem[o], st.num_layers,
                                 a_j, first, last)
        out.append(float(mem))
    return out


def stage_times(problem: Problem, a: Assignment) -> list[float]:
    """t_j of eq. T1."""
    v = problem.variants[a.variant]
    lists = v.cost_lists
    if lists is None:
        return _stage_sums(a, v.layer_time, v.first_time, v.last_time)
    return _stage_sums(a, *lists[:3])


def _stage_sums(a: Assignment, per_layer, first, last, fixed=None) -> list[float]:
    """Per stage ``stage_sum`` at its place (eqs. T1a, T1c), written out here: the local search calls this per
    candidate, and the call per stage cost 4.5 -> 6.1 us a plan of 16 stages (t and s)."""
    p = len(a.stages)
    out = []
    for j, st in enumerate(a.stages):
        o = st.option
        x = st.num_layers * per_layer[o] if fixed is None else fixed[o] + st.num_layers * per_layer[o]
        x += first[o] if j == 0 else 0.0
        x += last[o] if j == p - 1 else 0.0
        out.append(float(x))
    return out


def stage_sum(o: int, n: int, is_first: bool, is_last: bool, per_layer, first, last, fixed=None) -> float:
    """``[fixed] + n per_layer + [first stage] first + [last stage] last`` of option ``o``, added in that order: t_j
    of eq. T1 from (layer_time, first_time, last_time), s_j from (sync_per_layer, sync_first, sync_last, sync_fixed)."""
    x = n * per_layer[o] if fixed is None else fixed[o] + n * per_layer[o]
    x += first[o] if is_first else 0.0
    x += last[o] if is_last else 0.0
    return float(x)


def boundary_times(problem: Problem, a: Assignment) -> list[float]:
    """c_j of eq. T1 (P-1 values)."""
    v = problem.variants[a.variant]
    g = [problem.options[s.option].endpoint for s in a.stages]
    return [float(v.p2p_time[g[j], g[j + 1]]) for j in range(len(g) - 1)]


def wrap_time(problem: Problem, a: Assignment) -> float:
    """c_w of eq. I1: the boundary from the last stage back to the first (interleaving's wrap-around)."""
    v = problem.variants[a.variant]
    return float(v.p2p_time[problem.options[a.stages[-1].option].endpoint,
                            problem.options[a.stages[0].option].endpoint])


def sync_times(problem: Problem, a: Assignment) -> list[float]:
    """s_j of eq. T1."""
    v = problem.variants[a.variant]
    lists = v.cost_lists
    if lists is None:
        return _stage_sums(a, v.sync_per_layer, v.sync_first, v.sync_last, v.sync_fixed)
    return _stage_sums(a, lists[4], lists[5], lists[6], lists[3])


def sync_terms(problem: Problem, a: Assignment) -> list[float]:
    """Eq. T3's (I1's) terms s_j - beta * sum_{k<j} t_k per stage (seconds): sigma is their maximum."""
    v = problem.variants[a.variant]
    return sync_excess(stage_times(problem, a), sync_times(problem, a), sigma_share(v.vpp, problem.p2p_blocking))


def evaluate(problem: Problem, a: Assignment) -> float:
    """The objective: iteration time T of eq. T1 (seconds, ``pipeline.iteration_time`` under 1F1B), plus the
    variant's linear terms of eq. EX1 when it has them. Does not check feasibility."""
    return time_of(problem, a) + extra_objective(problem, a)


def time_of(problem: Problem, a: Assignment) -> float:
    """Iteration time T of eq. T1 (I1 for vpp > 1), seconds, without eq. EX1's terms."""
    v = problem.variants[a.variant]
    t, c, s = stage_times(problem, a), boundary_times(problem, a), sync_times(problem, a)
    if v.vpp > 1:  # eq. I1
        time = iteration_time(t, c, s, v.num_microbatches, "interleaved", v.vpp, wrap_time(problem, a))
    else:
        time = iteration_time(t, c, s, v.num_microbatches, blocking=problem.p2p_blocking)
    return float(time)


def extra_objective(problem: Problem, a: Assignment) -> float:
    """Eq. EX1 of the assignment (0.0 when its variant has no extra terms)."""
    x = problem.variants[a.variant].extra
    if x is None:
        return 0.0
    p = len(a.stages)
    out = x.const
    for j, st in enumerate(a.stages):
        o = st.option
        out += float(x.per_stage[o] + st.num_layers * x.per_layer[o] + (x.first[o] if j == 0 else 0.0)
                     + (x.last[o] if j == p - 1 else 0.0))
    return out


def over_time(problem: Problem, a: Assignment) -> str | None:
    """Eq. TX1e: why the assignment's T exceeds ``problem.max_time_s`` (None: within it, or no bound). The
    slack TIME_RTOL is float noise only (the MILP's row holds within HiGHS' feasibility tolerance)."""
    if problem.max_time_s is None:
        return None
    t = time_of(problem, a)
    if t <= problem.max_time_s * (1 + TIME_RTOL):
        return None
    return f"iteration time {t:.6g} s over the bound {problem.max_time_s:.6g} s (eq. TX1e)"


def violations(problem: Problem, a: Assignment, time_bound: bool = True) -> list[str]:
    """Every constraint the assignment breaks (empty list: feasible). ``time_bound=False`` leaves eq. TX1e out
    (the branch and bound tells an engine's plan just past T_max, within its rounding, from a broken one)."""
    out: list[str] = []
    if not 0 <= a.variant < len(problem.variants):
        return [f"variant {a.variant} out of range"]
    if not 1 <= len(a.stages) <= problem.max_stages:
        out.append(f"{len(a.stages)} stages, allowed 1..{problem.max_stages}")
    if any(s.num_layers < 1 for s in a.stages):
        out.append("a stage has no layer")
    if sum(s.num_layers for s in a.stages) != problem.num_layers:
        out.append(f"layers sum to {sum(s.num_layers for s in a.stages)}, need {problem.num_layers}")
    if any(not 0 <= s.option < problem.num_options for s in a.stages):
        return out + ["option index out of range"]
    used = [0] * len(problem.groups)
    for s in a.stages:
        for g, n in problem.options[s.option].usage:  # eq. G1
            used[g] += n
    for g, (u, cap) in enumerate(zip(used, problem.group_capacity)):
        if u > cap:
            out.append(f"group {problem.groups[g]} uses {u} GPUs of {cap}")
    if problem.budget is not None:  # eq. W1
        b = problem.budget
        used = b.used([s.option for s in a.stages])
        if used > b.limit:
            out.append(f"{b.name} {used} over its limit {b.limit}")
        if used < b.lower:  # eq. W1b
            out.append(f"{b.name} {used} under its floor {b.lower}")
    v = problem.variants[a.variant]
    if v.vpp > 1 and v.num_stages and len(a.stages) != v.num_stages:  # eq. I5
        out.append(f"{len(a.stages)} stages, variant {a.variant} (vpp {v.vpp}) has {v.num_stages}")
    for j, st in enumerate(a.stages):
        if not v.allowed[st.option]:
            out.append(f"stage {j}: option {st.option} not allowed with variant {a.variant}")
    for j, (mem, st) in enumerate(zip(stage_memory(problem, a), a.stages)):
        cap = v.mem_capacity[st.option]
        if not fits_memory(mem, cap):
            out.append(f"stage {j} needs {mem / GIB:.2f} GiB of {cap / GIB:.2f} GiB")
    opts = [problem.options[s.option] for s in a.stages]
    if problem.uniform and len({o.signature for o in opts}) > 1:
        out.append("stages differ in (tp, dp, recompute, ep) under a uniform target")
    if problem.same_tp_first_last and opts[0].tp != opts[-1].tp:
        out.append("first and last stage tp differ (tied embeddings)")
    late = over_time(problem, a) if time_bound and not out else None
    return out + [late] if late else out


@dataclass(frozen=True)
class RawResult:
    """What every solver returns: ``solve(problem, options, hint=None) -> RawResult``.

    ``status`` is a ``haap_milp.specs.Status`` value name (OPTIMAL, FEASIBLE, INFEASIBLE,
    NO_SOLUTION, ERROR). ``objective_s`` must equal ``evaluate(problem, assignment)``
    (CP-SAT: within its stated rounding error). ``bound_s`` is a proven lower bound on the
    optimum (None when the method proves nothing, e.g. DP). The planner decodes the
    assignment into a ``Plan`` and wraps everything in a ``SolveResult``.
    """

    status: str
    solver: str
    assignment: Assignment | None = None
    objective_s: float | None = None
    bound_s: float | None = None
    wall_time_s: float = 0.0
    message: str = ""
    stats: dict = field(default_factory=dict)
