"""Pipeline closed forms shared by the problem semantics and the estimator (a leaf module).

Both ``problem.evaluate`` (what solvers optimise) and ``estimator.schedule`` (what a plan is
scored at) use this one function, so the solver's objective and the estimate cannot drift apart.
"""

from __future__ import annotations

BWD_SHARE = 2 / 3  # backward share of a stage's fwd+bwd time without recompute (bwd = 2 x fwd FLOPs,
# Narayanan et al. SC'21 sec. 3.3); with recompute it is larger, so 2/3 keeps eq. T3 conservative


def exposed_sync(t: list[float], s: list[float], bwd_share: float = BWD_SHARE) -> float:
    """sigma of eq. T3: stage j's DP sync starts when its own last backward ends, which is at least
    the backward time of the stages before it earlier than the first stage's; the iteration ends at
    max_j (s_j - bwd_share * sum_{k<j} t_k) after the first stage's last backward (>= s_0)."""
    out, before = s[0], 0.0
    for j in range(1, len(s)):
        before += t[j - 1]
        out = max(out, s[j] - bwd_share * before)
    return out


def steady_period(t: list[float], c: list[float], num_microbatches: int, schedule: str = "1f1b") -> float:
    """tau of eq. T2: stage times t (P values), boundary times c (P-1 values). GPipe keeps every
    micro-batch in flight, so it never waits for a round trip: only the stage and link terms."""
    p = len(t)
    tau = max(max(t), max(c, default=0.0) / 2)
    if schedule == "gpipe":
        return tau
    suffix = 0.0  # sum_{k>=j} t_k + sum_{j<=k<P-1} c_k, built from the last stage backwards
    for j in range(p - 1, -1, -1):
        suffix += t[j] + (c[j] if j < p - 1 else 0.0)
        if p - j < num_microbatches:  # stage j must wait for a backward before its (P-j+1)-th forward
            tau = max(tau, suffix / (p - j))
    return tau
