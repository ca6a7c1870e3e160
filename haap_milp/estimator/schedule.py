"""Pipeline schedules: iteration time and activations in flight (closed forms).

1F1B (PipeDream-Flush; Narayanan et al. SC'21 sec. 2.2), problem.py eq. T1::

    T = (M - 1)·tau + sum_j t_j + sum_j c_j + max_j (s_j - (2/3)·sum_{k<j} t_k),   (problem.py eq. T3)
    tau = max(max_j t_j, max_j c_j / 2, max_{j: P-j < M} (sum_{k>=j} t_k + c_k) / (P - j))  (problem.py eq. T2)

Links are pipeline resources (each direction carries half of c_j); the in-flight term is 1F1B's
round trip over the P - j micro-batches stage j holds (see problem.py). GPipe has
the same time (same bubble, (P-1)/M of the ideal) but keeps all M micro-batches in flight.
Interleaved 1F1B with v model chunks per stage (SC'21 sec. 2.2.2) shrinks the bubble by v and sends
v times as many activations::

    steady = max(max_j t_j, v·max_j c_j, v·c_wrap);   T = (M - 1/v)·steady + sum_j t_j / v + sum_j c_j + max_j s_j

(uniform stages, no comm: M·t + (P-1)·t/v, the paper's bubble; v = 1 gives eq. T1; c_wrap is the
boundary from the last stage back to the first).
In flight under 1F1B, stage j holds min(P - j, M) micro-batches (eq. M1). Interleaved: Megatron's
warm-up count ``(P - j - 1)·2 + (v - 1)·P`` chunks plus the one being computed, each chunk 1/v of
the stage's layers: ``((P-j-1)·2 + (v-1)·P + 1)/v`` stage-equivalents, which on the first stage is
P·(1 + (P-1)/(P·v)) (Megatron theoretical_memory_usage.py); capped at M.
"""

from __future__ import annotations

from haap_milp.pipeline import exposed_sync, steady_period


def inflight(schedule: str, j: int, pp: int, m: int, vpp: int = 1) -> float:
    """Micro-batches' worth of activations stage j keeps at its peak."""
    if schedule == "gpipe":
        return float(m)
    if schedule == "interleaved" and vpp > 1:
        return min(((pp - j - 1) * 2 + (vpp - 1) * pp + 1) / vpp, float(m))
    return float(min(pp - j, m))


def iteration_time(schedule: str, t: list[float], c: list[float], s: list[float], m: int, vpp: int = 1,
                   c_wrap: float = 0.0) -> float:
    """Iteration time of the schedule (module doc)."""
    if schedule == "interleaved" and vpp > 1:
        steady = max([*t, *(vpp * x for x in c), vpp * c_wrap])
        return (m - 1 / vpp) * steady + sum(t) / vpp + sum(c) + max(s)
    steady = steady_period(t, c, m, schedule)
    return (m - 1) * steady + sum(t) + sum(c) + exposed_sync(t, s)
