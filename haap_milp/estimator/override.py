"""Profile override: measured times (and memory) replace the analytic ones where a profile covers them.

A profiled time is forward + backward of one micro-batch, TP communication included, without
recomputation; other recompute modes scale it by the analytic ratio time(recompute) / time(none).
Measured memory (parameters + gradients + optimizer + one micro-batch of activations per GPU) is split
into a static part and activations per sample by a least-squares line over the measured micro-batch
sizes (``Profile.memory_split``); with one point, the analytic static part is kept and the rest is
activations. Activations under recomputation scale by the analytic ratio too.

Coverage (``coverage``, the one home of the rule; presolve, the estimator and the CLI ask it): a GPU
type the profile does not mention at all is priced analytically (the report says so). For a type it
mentions, a (tp, per-replica micro-batch) point is ``measured``, ``oom`` (measured out of memory),
``interpolated`` (strictly between two measured micro-batches of the same tp) or ``missing``.
``Profile.fallback`` decides which may be priced (``may_price``): ``none`` (default) only measured points;
``interpolate`` also interpolated ones (linear in the micro-batch, time and memory: ``Profile.lookup``);
``analytic`` also missing ones (analytic model, with a warning naming them). An out-of-memory point is
never priced: a measurement says it does not fit.
"""

from __future__ import annotations

from dataclasses import replace

from haap_milp.errors import HaapInputError
from haap_milp.estimator.costs import StageConfig
from haap_milp.estimator.profiles import Profile
from haap_milp.estimator.results import StageCost

FALLBACKS = ("none", "interpolate", "analytic")
FALLBACK_FLAG = "--profile-fallback"
_PRICED = {"none": {"measured", "unprofiled"}, "interpolate": {"measured", "unprofiled", "interpolated"},
           "analytic": {"measured", "unprofiled", "interpolated", "missing"}}
WHY = {"missing": "not measured", "oom": "measured out of memory", "interpolated": "between measured micro-batches"}


class ProfileCoverageError(HaapInputError):
    """A point the profile does not cover was to be priced under a fallback that refuses it."""


def coverage(profile: Profile | None, gpu: str, tp: int, mbs: float) -> str:
    """unprofiled | measured | oom | interpolated | missing (module doc)."""
    if profile is None or gpu not in profile.gpu_types():
        return "unprofiled"
    whole = float(mbs).is_integer()
    if whole and (gpu, tp, int(mbs)) in profile.oom_points():
        return "oom"
    if whole and (gpu, tp, int(mbs)) in profile.entries:
        return "measured"
    return "interpolated" if profile.lookup(gpu, tp, mbs) is not None else "missing"


def may_price(status: str, fallback: str) -> bool:
    """Whether a point of this coverage status is priced under ``fallback``."""
    return status in _PRICED[fallback]


def check_fallback(fallback: str, flag: str = FALLBACK_FLAG) -> str:
    if fallback not in FALLBACKS:
        raise HaapInputError(f"{flag} {fallback!r}: must be one of {', '.join(FALLBACKS)} (none: points the profile "
                             "lacks leave the search; interpolate: also between measured micro-batches; analytic: "
                             "the analytic model prices them, with a warning).", field="profile_fallback",
                             value=fallback)
    return fallback


def uncovered_message(profile: Profile, gpu: str, tp: int, mbs: float, status: str) -> str:
    """One sentence: why the point is refused and the flag that would price it."""
    have = [e.mbs for e in profile.points(gpu, tp)]
    measured = f"micro-batches {', '.join(map(str, have))}" if have else "no micro-batch"
    fix = ("a measurement says it does not fit" if status == "oom" else
           f"{FALLBACK_FLAG} {'interpolate' if status == 'interpolated' else 'analytic'} would price it")
    return (f"{gpu} at tp {tp}, micro-batch {mbs:g} is {WHY[status]} in the profile (it has {measured} at tp {tp}); "
            f"{fix}")


def _ratio(x: float, base: float) -> float:
    return x / base if base > 0 else 1.0


def apply_profile(profile: Profile | None, kind: str, cost: StageCost, c: StageConfig,
                  analytic_none: StageCost | None) -> StageCost:
    """``cost`` with the profiled parts of (c.gpu_type, c.tp, per-replica micro-batch) substituted."""
    if profile is None:
        return cost
    status = coverage(profile, c.gpu_type, c.tp, c.micro_batch)
    if not may_price(status, profile.fallback):
        raise ProfileCoverageError(uncovered_message(profile, c.gpu_type, c.tp, c.micro_batch, status) + ".",
                                   field="profile", value=(c.gpu_type, c.tp, c.micro_batch))
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
