"""Profile override: measured times (and memory) replace the analytic ones where a profile covers them.

A profiled time is forward + backward of one micro-batch, TP communication included, without
recomputation; other recompute modes scale it by the analytic ratio time(recompute) / time(none).
Measured memory (parameters + gradients + optimizer + one micro-batch of activations per GPU) is split
into a static part and activations per sample by a least-squares line over the measured micro-batch
sizes (``Profile.memory_split``); with one point, the analytic static part is kept and the rest is
activations. Activations under recomputation scale by the analytic ratio too.
"""

from __future__ import annotations

from dataclasses import replace

from haap_milp.estimator.costs import StageConfig
from haap_milp.estimator.profiles import Profile
from haap_milp.estimator.results import StageCost


def _ratio(x: float, base: float) -> float:
    return x / base if base > 0 else 1.0


def apply_profile(profile: Profile | None, kind: str, cost: StageCost, c: StageConfig,
                  analytic_none: StageCost | None) -> StageCost:
    """``cost`` with the profiled parts of (c.gpu_type, c.tp, per-replica micro-batch) substituted."""
    if profile is None:
        return cost
    e = profile.lookup(c.gpu_type, c.tp, c.micro_batch)
    if e is None:
        return cost
    base = analytic_none or cost
    measured = {"layer": e.layer_time_s, "embedding": e.embedding_time_s, "head": e.head_time_s}[kind]
    upd: dict[str, float] = {}
    if measured is not None:
        t = measured * _ratio(cost.time_s, base.time_s)
        upd.update(time_s=t, compute_s=t, tp_comm_s=0.0, ep_comm_s=0.0, cp_comm_s=0.0)
    mem = getattr(e, f"{kind}_memory_bytes")
    if mem is not None:
        split = profile.memory_split(c.gpu_type, c.tp, kind)
        if split is not None:
            static, act_none = split[0], split[1] * c.micro_batch
        else:
            static, act_none = base.static_bytes, max(0.0, mem - base.static_bytes)
        k = _ratio(static, cost.static_bytes)
        upd.update(static_bytes=static, act_bytes=act_none * _ratio(cost.act_bytes, base.act_bytes),
                   weights_bytes=cost.weights_bytes * k, grads_bytes=cost.grads_bytes * k,
                   optimizer_bytes=cost.optimizer_bytes * k)
    return replace(cost, **upd)
