"""The pipeline schedule's closed forms and the constants they share (a leaf module: no haap_milp imports).

Every module that needs the iteration time, the steady period, the exposed sync, the in-flight
micro-batches, a stage's memory, the backward share, GIB or the shared tolerances takes it from here:
``problem.evaluate``/``stage_memory`` (what the solvers optimise), the slot tables
(``solvers/common/slot_bounds.py``), the brute-force oracle, the estimator (``estimator/schedule.py``,
``estimator/plan_estimate.py``), the simulator's closed forms, ``explain`` and ``check``. So the solver's
objective, the estimate and the judges cannot drift apart. Equation labels: formulations/README.md.

Notation (seconds, bytes; stage j = 0 .. P-1 in pipeline order, M micro-batches)::

    t_j  stage j's forward + backward time of one micro-batch
    c_j  boundary j -> j+1, activation forward + gradient backward of one micro-batch (P-1 values)
    s_j  stage j's DP gradient sync + optimizer step, once per iteration

    T     = (M - 1) * tau + sum_j t_j + sum_j c_j + sigma                                 (eq. T1)
    tau   = max(max_j t_j, max_j c_j / 2,
                max_{j <= k, P-j < M} (sum_{j<=i<=k} t_i + sum_{j<=i<k} c_i) / (k-j+1))     (eq. T2)
            [blocking p2p: also max_j (t_j + e_j (c_{j-1} + c_j)), c_{-1} = c_{P-1} = 0,
             e_j = 1 at the two end stages, 1/2 between]                                  (eq. T2b)
    sigma = max_j (s_j - beta * sum_{k<j} t_k), beta = BWD_SHARE (0 under blocking p2p)     (eq. T3)
    mem_j = fixed + n_j * (static + a_j * act) [+ first/last extras]  with a_j in flight   (eqs. M1, M2)

Interleaved 1F1B, vpp chunks per stage (eqs. I1-I4; c_w the wrap boundary P-1 -> 0)::

    T_v   = (M - 1/vpp) tau_v + sum_j t_j / vpp + vpp sum_j c_j + (vpp-1) c_w + sigma_v         (eq. I1)
    tau_v = max(max_j t_j, vpp max_j c_j / 2, (vpp-1) c_w / 2, max_j R_j / N_j)               (eq. I2, I3)
    N_j   = min(2 (P-j-1) + (vpp-1) P + 1, M vpp) chunks in flight, a_j = N_j / vpp            (eq. I4)
    tau_v >= (sum_{i in W} t_i + vpp sum_{W} c + (vpp-1) c_w [W wraps]) / (2 n + 1), windows W    (eq. I7)

The float operations of each formula happen in the order ``problem.evaluate`` has always used; every
caller (scalars or numpy arrays) goes through the same function, so the results agree to the last bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

GIB = 2**30  # bytes per GiB (binary: HBM sold as "80 GB" is an 80 GiB part)

# Eq. T2b: the share of a boundary's round trip c_j (activation forward + gradient backward) that a stage's
# own instruction stream spends when sends block it: one way of each adjacent boundary, its own sends (the
# activation to j+1, the gradient to j-1); the receives are its neighbours' sends. This is the rule of
# Sailor's runtime simulator (SOSP'25, sailor/Planner/simulations/runtime_simulator.py,
# estimate_p2p_pipeline_times: a middle stage's straggler term is its compute plus one activation send
# and one gradient send), which its authors validated against real DeepSpeed runs on the Fig. 8b cluster.
SEND_SHARE = 0.5
# ... and an end stage (first or last, P >= 2), whose sends and receives all go to its one neighbour, the
# whole round trip of its boundary: the same simulator charges the last stage two gradient sends and the first
# stage two activation sends (for P >= 4; one for P <= 3, where haap is pessimistic by half a boundary).
END_SEND_SHARE = 1.0

# Relative tolerances shared across modules.
MEM_RTOL = 1e-9  # a stage fits when mem <= capacity * (1 + MEM_RTOL) (problem.violations, tables, estimator, check)
TIME_RTOL = 1e-9  # float slack when comparing or inverting times (layer bounds from a time cut-off, "this term binds")


def within_gap(objective_s: float, bound_s: float, relative_gap: float, tolerance_s: float = 0.0) -> bool:
    """A plan of time ``objective_s`` is proven (OPTIMAL) against the lower bound ``bound_s``: within the requested
    relative gap, plus the engine's stated rounding ``tolerance_s`` and float slack."""
    return objective_s - bound_s <= relative_gap * objective_s + tolerance_s + TIME_RTOL * objective_s

# Backward share of a stage's fwd+bwd time t_j. Without recompute the backward does two GEMM passes
# (input and weight gradients) per forward pass, bwd = 2 x fwd FLOPs (Narayanan et al., SC'21, sec. 3.3),
# so 2/3 of t_j. Full recompute replays the forward inside the backward: 1 + 2 + 1 passes, backward 3/4
# (Korthikanti et al. 2022, "Reducing activation recomputation", sec. 5). Selective recompute replays
# only attention's softmax/dropout, a few percent: kept at 2/3.
BWD_SHARE = 2 / 3
BWD_SHARE_FULL_RECOMPUTE = 3 / 4


def bwd_share(recompute: str) -> float:
    """Backward share of t_j for a stage's recompute mode (the simulator's forward/backward split).

    The objective's eq. T3 uses the constant ``BWD_SHARE`` for every stage instead: it is the smallest
    share, so sigma (which subtracts ``share * sum_{k<j} t_k``) is never under-estimated, and a constant
    keeps eq. T3 linear for the MILP/CP-SAT models."""
    return BWD_SHARE_FULL_RECOMPUTE if recompute == "full" else BWD_SHARE


def send_shares(p: int) -> list[float]:
    """Eq. T2b's e_j per stage of a P-stage pipeline: END_SEND_SHARE at the two end stages, SEND_SHARE between."""
    return [END_SEND_SHARE if j in (0, p - 1) else SEND_SHARE for j in range(p)]


def sync_share(blocking: bool) -> float:
    """beta of eq. T3: how much of the earlier stages' time a stage's DP sync may overlap. Under the blocking
    PipelineEngine runtime (DeepSpeed) every stage reduces its gradients after the pipeline flush, nothing
    overlapped: ``TrainSchedule`` ends with ReduceTiedGrads (a collective of the first and the last stage for
    tied embeddings) then ReduceGrads, and the measured runtime of Sailor's Fig. 8b cluster overlaps nothing
    (its validated simulator adds the largest stage's sync after the pipeline). Elsewhere BWD_SHARE."""
    return 0.0 if blocking else BWD_SHARE


def sigma_share(vpp: int, blocking: bool) -> float:
    """The share of eq. T3 (1F1B, ``sync_share``) or of eq. I1's sigma_v (interleaved: a rank's last backward is one
    chunk's, so BWD_SHARE / vpp)."""
    return BWD_SHARE / vpp if vpp > 1 else sync_share(blocking)


def exposed_sync(t: Sequence[float], s: Sequence[float], bwd_share: float = BWD_SHARE) -> float:
    """sigma of eq. T3: stage j's DP sync starts when its own last backward ends, which is at least
    the backward time of the stages before it earlier than the first stage's; the iteration ends at
    max_j (s_j - bwd_share * sum_{k<j} t_k) after the first stage's last backward (>= s_0)."""
    return max(sync_excess(t, s, bwd_share))


def sync_excess(t: Sequence[float], s: Sequence[float], bwd_share: float = BWD_SHARE) -> list[float]:
    """Eq. T3's terms, s_j - bwd_share * sum_{k<j} t_k per stage j (seconds): sigma is their maximum, and the
    stage reaching it is the one whose sync the iteration waits for."""
    out, before = [s[0]], 0.0
    for j in range(1, len(s)):
        before += t[j - 1]
        out.append(s[j] - bwd_share * before)
    return out


def steady_period(t: Sequence[float], c: Sequence[float], num_microbatches: int, schedule: str = "1f1b",
                  blocking: bool = False) -> float:
    """tau of eq. T2: stage times t (P values), boundary times c (P-1 values). 1F1B: every window of stages
    j..k (P - j < M) carries its k - j + 1 micro-batches once round per period: tau >= (sum_{i=j..k} t_i +
    sum_{j<=i<k} c_i) / (k - j + 1) (k = P-1: the in-flight round trip; O(P^2) windows). GPipe keeps every
    micro-batch in flight, so it never waits for a round trip: only the stage and link terms.
    ``blocking`` (eq. T2b; runtimes whose pipeline sends run in the stage's own instruction stream,
    DeepSpeed's PipelineEngine): each micro-batch a stage also spends its own sends, the activation to
    stage j+1 and the gradient to stage j-1, one way each: tau >= t_j + SEND_SHARE * (c_{j-1} + c_j)."""
    p = len(t)
    tau = max(max(t), max(c, default=0.0) / 2)
    if blocking:
        for j, share in enumerate(send_shares(p)):
            tau = max(tau, t[j] + share * ((c[j - 1] if j > 0 else 0.0) + (c[j] if j < p - 1 else 0.0)))
    if schedule == "gpipe":
        return tau
    return max(tau, binding_window(t, c, num_microbatches)[0])


def window_means(t, c, num_microbatches: int):
    """Eq. T2's window terms under 1F1B: yields ((sum_{i=j..k} t_i + sum_{j<=i<k} c_i) / (k - j + 1), j, k) for every
    window of stages j < k with P - j < M (k = j is tau >= t_j, eq. T2's first term). Each sum is built from k backwards,
    so k = P - 1 adds as the in-flight round trip always has; t_i and c_i may be floats or numpy arrays (the
    brute-force oracle passes one array per stage). O(P^2) windows."""
    p = len(t)
    first = max(0, p - num_microbatches + 1)  # stages j with P - j < M run a forward after a backward
    for k in range(p - 1, first, -1):
        window = t[k]
        for j in range(k - 1, first - 1, -1):
            window = window + (t[j] + c[j])
            yield window / (k - j + 1), j, k


def binding_window(t: Sequence[float], c: Sequence[float], num_microbatches: int) -> tuple[float, int, int]:
    """The largest of eq. T2's window terms and its window: (value, j, k); (0.0, -1, -1) when there is none."""
    best = (0.0, -1, -1)
    for term in window_means(t, c, num_microbatches):
        if term[0] > best[0]:
            best = term
    return best


def compose_iteration_time(num_microbatches: int, tau, sum_t, sum_c, sigma):
    """Eq. T1 from its parts: (M - 1) * tau + sum_j t_j + sum_j c_j + sigma (scalars or numpy arrays).

    The one place that adds the parts up; callers with their own tau or sigma (the brute-force oracle's
    vectorised forms, the simulator's comparison forms) compose through it too."""
    return (num_microbatches - 1) * tau + sum_t + sum_c + sigma


def iteration_time(t: Sequence[float], c: Sequence[float], s: Sequence[float], num_microbatches: int,
                   schedule: str = "1f1b", vpp: int = 1, c_wrap: float = 0.0, blocking: bool = False) -> float:
    """Iteration time T (seconds) of a schedule.

    1F1B and GPipe: eq. T1 with tau of eq. T2 (GPipe: no round-trip term) and sigma of eq. T3 (no
    sync times given: sigma = 0). Interleaved 1F1B with vpp > 1 model chunks per stage: eq. I1
    (``interleaved_iteration_time``; c_wrap is the boundary from the last stage back to the first)."""
    m = num_microbatches
    if schedule == "interleaved" and vpp > 1:
        return interleaved_iteration_time(t, c, s, m, vpp, c_wrap)
    tau = steady_period(t, c, m, schedule, blocking)
    sigma = exposed_sync(t, s, sigma_share(1, blocking)) if len(s) else 0.0
    return compose_iteration_time(m, tau, sum(t), sum(c), sigma)


# --------------------------------------------------------------------------- interleaved 1F1B (eqs. I1-I4)
#
# Megatron-Core 0.16 ``forward_backward_pipelining_with_interleaving`` (megatron/core/pipeline_parallel/
# schedules.py): each of the P ranks holds vpp model chunks; virtual stage k = c*P + j is chunk c of rank j, so
# a micro-batch passes the P ranks vpp times, crossing every boundary j -> j+1 vpp times and the wrap
# P-1 -> 0 vpp-1 times each way. Ranks run their chunks in the order of ``get_schedule_table`` (groups of
# ``microbatch_group_size_per_vp_stage`` = P micro-batches, all chunks of a group before the next group),
# ``get_pp_rank_microbatches`` warm-up forwards (P - j - 1)*2 + (vpp - 1)*P, then one forward one backward.
# The forms below are what haap optimises for such a plan; ``benchmarks/sim_vs_closed_form.py`` measures them
# against the event replay of that exact order (``simulate.py``).


def interleaved_tau_weight(num_microbatches: int, vpp: int = 1):
    """The coefficient of tau in eqs. T1 / I1: M - 1 (1F1B, vpp = 1: the integer itself, so existing sums stay
    bit-identical) or M - 1/vpp (interleaved: the fill and drain shrink to one chunk's worth of the period)."""
    return num_microbatches - 1 if vpp <= 1 else num_microbatches - 1 / vpp


def interleaved_inflight_chunks(j: int, p: int, m: int, vpp: int) -> int:
    """Eq. I4: model chunks whose activations rank j holds at its peak under interleaving: Megatron's warm-up
    count (P - j - 1)*2 + (vpp - 1)*P plus the chunk being computed, at most all M*vpp chunks."""
    return min((p - j - 1) * 2 + (vpp - 1) * p + 1, m * vpp)


def interleaved_round_trip(after: float, before: float, links_after: float, links_before: float, vpp: int,
                           c_wrap: float) -> float:
    """Eq. I3's numerator for rank j: the sum over its vpp chunks of each chunk's residence (forward start to
    backward end: the rest of the virtual pipeline after it, forward and back), by chunk c of rank j ...

        R_j = (v+1)/2 * sum_{i>=j} t_i + (v-1)/2 * sum_{i<j} t_i + v(v+1)/2 * sum_{b>=j} c_b
              + v(v-1)/2 * (sum_{b<j} c_b + c_wrap)

    (rank i's chunk c' follows rank j's chunk c when c'P + i >= cP + j: v(v+1)/2 pairs for i >= j, v(v-1)/2
    for i < j; each chunk costs t_i / v; links alike, the wrap after every chunk but the last). The four sums
    are given (``after`` = sum_{i>=j} t_i, ...): ``interleaved_period`` keeps them running, O(P) for all ranks."""
    v = vpp
    return ((v + 1) / 2 * after + (v - 1) / 2 * before + v * (v + 1) / 2 * links_after
            + v * (v - 1) / 2 * (links_before + c_wrap))


def interleaved_period(t: Sequence[float], c: Sequence[float], num_microbatches: int, vpp: int,
                       c_wrap: float = 0.0) -> float:
    """Eq. I2: the steady period per micro-batch of interleaved 1F1B::

        tau_v = max( max_j t_j,  vpp * max_j c_j / 2,  (vpp - 1) * c_wrap / 2,  max_j R_j / N_j )

    Each rank still computes all its layers once per micro-batch (t_j); each link direction carries vpp
    activations (or gradients) of c_j / 2 per micro-batch, the wrap vpp - 1; and by Little's law rank j, which
    holds at most N_j chunks in flight (eq. I4) and starts vpp chunks per period, needs
    N_j >= (vpp / tau) * (mean chunk residence) = R_j / tau (eq. I3). For vpp = 1 this is eq. T2's round-trip
    term with N_j = P - j. And every window of eq. I7 (``interleaved_window_means``)."""
    p, m, v = len(t), num_microbatches, vpp
    tau = max(max(t), v * max(c, default=0.0) / 2, (v - 1) * c_wrap / 2)
    for term, _, _ in interleaved_window_means(t, c, m, v, c_wrap):  # eq. I7
        tau = max(tau, term)
    # sums after rank j accumulated from the last rank (not a total less a prefix: no cancellation on the last
    # ranks), sums before it from the first
    after = list(accumulate(reversed(t)))[::-1]
    links_after = list(accumulate(reversed(c)))[::-1] + [0.0]
    before = links_before = 0.0
    for j in range(p):
        r = interleaved_round_trip(after[j], before, links_after[j], links_before, v, c_wrap)
        tau = max(tau, r / interleaved_inflight_chunks(j, p, m, v))
        before += t[j]
        links_before += c[j] if j < len(c) else 0.0
    return tau


def interleaved_window_means(t, c, num_microbatches: int, vpp: int, c_wrap=0.0):
    """Eq. I7, eq. T2's windows under interleaved 1F1B: yields (mean, j, k) for every window of ranks j..k
    (j < k) and, through the wrap, of ranks j..P-1 then 0..k (k < j)::

        tau >= (sum_{ranks i in the window} t_i + vpp * sum_{links inside} c + (vpp - 1) c_w) / (2 n + 1)

    with n the window's links (c_w only where it wraps). Why (Megatron's order, ``schedules.py``): a rank's
    forward and backward ops are chunks of t_i / vpp, so one op index is tau / vpp of the period; rank j warms up
    W_j = 2 (P - j - 1) + (vpp - 1) P forwards, then alternates, so after its backward of op x it runs forward
    x + 1 + W_j. The cycle backward(x) at rank j -> its next forward -> the forwards of ranks j+1..k (each link
    c/2) -> rank k's next backward, x + 1 + W_j - W_k = x + 2n + 1 -> the backwards back to rank j (c/2 each)
    spends sum t / vpp + sum c over 2n + 1 op indices. Through the wrap the forward index grows by P (chunk c of
    rank P-1 feeds chunk c+1 of rank 0) and so does the backward's, which leaves the count 2n + 1; but a micro-
    batch crosses the wrap vpp - 1 times of vpp (the last chunk turns back instead), so the wrap counts vpp - 1
    times, as in eq. I2. A window needs its ranks in their steady phase (eq. I4: N_j < M vpp; through the wrap
    rank 0's). Measured against the event replay (random pipelines P 3-8, vpp 2-4, M 4P-16P, links up to 2x a
    stage): where a link exceeds 0.3 of a stage, eq. I1 with I7 is -20 %..+4 % of the replay (mean -4.2 %;
    negative: below it) against -27 %..+4 % (mean -8.2 %) without; its period is never above the replay's
    (formulations/README.md, tests/test_simulate_core.py).
    t_i, c_i, c_wrap: floats or numpy arrays alike (the brute-force oracle passes one array per rank)."""
    p, m, v = len(t), num_microbatches, vpp
    steady = [interleaved_inflight_chunks(j, p, m, v) < m * v for j in range(p)]
    for j in range(p):
        if not steady[j]:
            continue
        window = t[j]
        for k in range(j + 1, p):
            window = window + (t[k] + v * c[k - 1])
            yield window / (2 * (k - j) + 1), j, k
    if p < 2 or not steady[0]:  # (rank 0 holds the most chunks: its steady phase implies every rank's)
        return
    for j in range(1, p):
        window = (v - 1) * c_wrap + t[p - 1]
        for i in range(j, p - 1):
            window = window + (t[i] + v * c[i])
        n = p - j - 1
        for k in range(j):
            window = window + (t[k] + (v * c[k - 1] if k else 0.0))
            n += 1
            yield window / (2 * n + 1), j, k


def interleaved_iteration_time(t: Sequence[float], c: Sequence[float], s: Sequence[float], num_microbatches: int,
                               vpp: int, c_wrap: float = 0.0) -> float:
    """Eq. I1: iteration time of interleaved 1F1B with vpp chunks per rank::

        T_v = (M - 1/vpp) * tau_v + sum_j t_j / vpp + vpp * sum_j c_j + (vpp - 1) * c_wrap + sigma_v
        sigma_v = max_j (s_j - (BWD_SHARE / vpp) * sum_{k<j} t_k)

    Fill and drain: one chunk's pass through every rank (sum t / vpp) plus every crossing of the first
    micro-batch (vpp passes over each boundary and vpp - 1 over the wrap, forward and back): on uniform stages
    without links (M + (P-1)/vpp) t, the bubble of SC'21 sec. 2.2.2; with links the replay shows the fill
    growing by exactly vpp * sum c + (vpp-1) c_wrap. sigma_v: a rank's last backward is chunk 0 of the last
    micro-batch, which reaches rank j earlier than rank 0 by the backward of chunk 0 on ranks 0..j-1."""
    m, v = num_microbatches, vpp
    tau = interleaved_period(t, c, m, v, c_wrap)
    sigma = exposed_sync(t, s, sigma_share(v, False)) if len(s) else 0.0
    return interleaved_tau_weight(m, v) * tau + sum(t) / v + v * sum(c) + (v - 1) * c_wrap + sigma


def inflight_1f1b(position_from_end: int, num_microbatches: int) -> int:
    """Eq. M1: under 1F1B the stage at position q = P - j from the end (1 = last stage) holds
    min(q, M) micro-batches of activations at its peak."""
    return min(position_from_end, num_microbatches)


def inflight(schedule: str, j: int, pp: int, m: int, vpp: int = 1) -> float:
    """Micro-batches' worth of activations stage j (of pp) keeps at its peak.

    1F1B: eq. M1. GPipe: all M. Interleaved: eq. I4's chunks, each chunk 1/vpp of the stage's layers:
    ``((P-j-1)*2 + (vpp-1)*P + 1)/vpp`` stage-equivalents, which on the first stage is
    P*(1 + (P-1)/(P*vpp)) (Megatron theoretical_memory_usage.py); capped at M."""
    if schedule == "gpipe":
        return float(m)
    if schedule == "interleaved" and vpp > 1:
        return interleaved_inflight_chunks(j, pp, m, vpp) / vpp
    return float(inflight_1f1b(pp - j, m))


def stage_memory(fixed, layer_static, layer_act, num_layers, inflight_mb, first=None, last=None):
    """Eq. M2: peak bytes per GPU of a stage with ``num_layers`` layers and ``inflight_mb`` micro-batches
    in flight; ``first``/``last``: (static, act) bytes of the embedding / LM head when the stage holds it.

        mem = fixed + n * (static + a * act) + (first_static + a * first_act) + (last_static + a * last_act)

    Works on scalars and numpy arrays alike (an extra multiplied by a 0/1 mask adds exactly 0 or itself)."""
    a = inflight_mb
    mem = fixed + num_layers * (layer_static + a * layer_act)
    if first is not None:
        mem = mem + (first[0] + a * first[1])
    if last is not None:
        mem = mem + (last[0] + a * last[1])
    return mem


def memory_limit(capacity):
    """The largest memory that still fits ``capacity`` (tolerance MEM_RTOL; scalars or arrays)."""
    return capacity * (1 + MEM_RTOL)


def fits_memory(mem, capacity):
    """Eq. M2's test: mem <= capacity up to the relative tolerance MEM_RTOL."""
    return mem <= memory_limit(capacity)
