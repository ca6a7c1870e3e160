"""Mixed stages: data-parallel replicas of several GPU types in one stage (formulations/ eqs. H1-H6).

A mixed stage runs ``count_r`` replicas of ``tp_r`` GPUs of type r; each replica of type r runs ``m_r``
samples of every micro-batch (sum_r count_r·m_r = B, eq. H2). All D = sum_r count_r replicas form one
data-parallel group. Per type the estimator prices one GPU as a stage of D replicas whose per-replica
micro-batch is m_r (``layer_cost(type, tp_r, dp=D, samples=D·m_r)``: compute at b = m_r, the DP collective
over D ranks on that type's own links, optimizer state sharded over D). The stage then costs:

* time (eq. H3): the slowest type's, per layer kind — every replica must finish its share before the
  micro-batch moves on;
* sync (eq. H4): the slowest type's DP sync; the ring over the D replicas crosses the nodes of every type,
  so the slowest type's node links bind; with a measured network that has ``cross_type`` figures between
  the types, each type's node link is the slower of its own and the cross-type one (``_AcrossTypes``);
* memory (eq. H6): checked per type against its own capacity. The solver-facing arrays hold, per
  coefficient, the largest of ``coef_r · C_0 / C_r`` (C_r usable bytes of type r) with capacity C_0:
  if those fit, every type fits; exact when one type has the largest normalised coefficient in every term;
* p2p (eq. H5): the slowest pair of the two stages' types (each type's replicas send their share over
  their own NICs at most as slowly as the whole micro-batch).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from haap_milp.estimator import costs
from haap_milp.estimator.comm import Link
from haap_milp.estimator.results import StageCost
from haap_milp.network import pricing
from haap_milp.pipeline import stage_memory

#: (gpu_type, island, tp, count, samples per replica per micro-batch)
ReplicaKey = tuple[str, str, int, int, int]

_MEMORY = ("static_bytes", "act_bytes", "weights_bytes", "grads_bytes", "optimizer_bytes")


@dataclass(frozen=True)
class TypeCosts:
    """One replica type's prices (one GPU of it) and its usable memory."""

    replica: ReplicaKey
    layer: StageCost
    first: StageCost
    last: StageCost
    fixed_bytes: float
    fixed_sync_s: float
    capacity_bytes: float


@dataclass(frozen=True)
class MixedCosts:
    """The stage's combined prices (eqs. H3, H4, H6), memory normalised to ``capacity_bytes`` (type 0's)."""

    layer: StageCost
    first: StageCost
    last: StageCost
    fixed_bytes: float
    fixed_sync_s: float
    capacity_bytes: float
    types: tuple[TypeCosts, ...]
    memory_exact: bool  # one type binds in every memory coefficient (eq. H6 exact)


class _AcrossTypes:
    """A type's hardware whose DP collectives also cross to the nodes of ``others`` (eq. H4): the node link of
    each collective is the slower of its own and the measured ``cross_type`` figures (both directions)."""

    def __init__(self, hw: Any, others: tuple[str, ...]):
        self._hw, self._others = hw, others

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hw, name)

    def dp_links(self, kind: str, n: int, span: int, element_bytes: float, bucket_bytes: float | None = None):
        hw = self._hw
        intra, node = hw.dp_links(kind, n, span, element_bytes, bucket_bytes)
        size = bucket_bytes or pricing.dp_bucket_bytes(hw.network, n, element_bytes)
        for o in self._others:
            for pair in ((hw.gpu.name, o), (o, hw.gpu.name)):
                cross = pricing.links_of(hw.network, "cross_type", pair, hw.group.island)
                lk = pricing.node_link(cross, hw.gpus_per_node, size, node, kind)
                node = Link(min(node.bytes_per_s, lk.bytes_per_s), max(node.latency_s, lk.latency_s))
        return intra, node


def _cross_type_sync(est: Any, r: ReplicaKey, others: tuple[str, ...], dp: int, ep: int, recompute: str,
                     cp: int) -> tuple[float, float, float, float] | None:
    """(layer, first, last, fixed) exposed DP sync of type r over links that cross to ``others`` (eq. H4),
    or None when the measured network has no ``cross_type`` figure between them (own links bind then)."""
    gpu, island, tp, _count, m = r
    hw = est.hardware(gpu, island)
    net = hw.network
    if net is None or not any(pricing.links_of(net, "cross_type", pair, island)
                              for o in others for pair in ((gpu, o), (o, gpu))):
        return None
    wide, model, tr, cal = _AcrossTypes(hw, others), est.model, est.training, est.calibration
    c = costs.StageConfig(gpu, island, tp, dp, ep, 1, recompute, dp * m, cp)
    layer = 0.0  # the mean over dense and MoE layers, as Estimator.layer_cost
    for moe, w in ((False, 1.0 - est.moe_fraction), (True, est.moe_fraction)):
        if w > 0:
            sync = costs.param_sync(costs.layer_groups(model, moe, c), wide, tr, cal)
            layer += w * (sync.exposed_s + sync.opt_s)
    first = costs.embedding_cost(model, c, wide, tr, cal).sync_s
    last = costs.head_cost(model, c, wide, tr, cal, est.impl).sync_s
    return layer, first, last, costs.dp_latency_s(model, c, wide, tr, cal)


def type_costs(est: Any, r: ReplicaKey, dp: int, ep: int, recompute: str, cp: int = 1,
               others: tuple[str, ...] = ()) -> TypeCosts:
    """One type's prices as a stage of ``dp`` (all the stage's) replicas at per-replica micro-batch m_r; the
    sync over links that cross to the ``others`` types where the network measured them (eq. H4)."""
    gpu, island, tp, _count, m = r
    args = (gpu, tp, dp, ep, 1, recompute, dp * m)
    kw = {"island": island, "cp": cp}
    layer, first, last = est.layer_cost(*args, **kw), est.first_stage_extra(*args, **kw), est.last_stage_extra(*args,
                                                                                                              **kw)
    fixed_sync = est.stage_fixed_sync_s(gpu, island, tp, dp, cp=cp, ep=ep)
    cross = _cross_type_sync(est, r, others, dp, ep, recompute, cp) if others else None
    if cross is not None:  # the slower links only ever raise the sync
        layer, first, last = (replace(x, sync_s=max(x.sync_s, y)) for x, y in zip((layer, first, last), cross))
        fixed_sync = max(fixed_sync, cross[3])
    return TypeCosts(r, layer, first, last,
                     est.stage_fixed_bytes(gpu, tp, dp=dp, recompute=recompute, samples_per_microbatch=dp * m, cp=cp),
                     fixed_sync, est.usable_memory_bytes(gpu))


def _combine(parts: list[StageCost], shares: list[float], scale: list[float]) -> StageCost:
    """Eqs. H3, H4, H6 for one layer kind: the slowest type's times, the largest sync, the largest memory
    coefficient normalised by ``scale`` (C_0 / C_r), FLOPs of the whole micro-batch (share-weighted)."""
    slow = max(range(len(parts)), key=lambda i: (parts[i].time_s, -i))
    out = {f.name: getattr(parts[slow], f.name) for f in fields(StageCost)}
    for key in ("sync_s", "dp_comm_s", "optimizer_s"):
        out[key] = max(getattr(p, key) for p in parts)
    big = max(range(len(parts)), key=lambda i: (parts[i].static_bytes * scale[i], -i))
    for key in ("static_bytes", "weights_bytes", "grads_bytes", "optimizer_bytes"):
        out[key] = getattr(parts[big], key) * scale[big]
    out["act_bytes"] = max(p.act_bytes * s for p, s in zip(parts, scale))
    for key in ("model_flops", "hw_flops"):  # each type's figure is for D·m_r samples; it runs count_r·m_r
        out[key] = sum(getattr(p, key) * w for p, w in zip(parts, shares))
    return StageCost(**out)


def mixed_costs(est: Any, replicas: tuple[ReplicaKey, ...], ep: int, recompute: str, cp: int = 1) -> MixedCosts:
    """Eqs. H3-H6 for a mixed stage (``replicas`` in the stage's order; the first sets the memory unit)."""
    dp = sum(r[3] for r in replicas)
    names = tuple(dict.fromkeys(r[0] for r in replicas))
    types = tuple(type_costs(est, r, dp, ep, recompute, cp, tuple(n for n in names if n != r[0])) for r in replicas)
    c0 = types[0].capacity_bytes
    scale = [c0 / t.capacity_bytes for t in types]
    shares = [r[3] / dp for r in replicas]
    layer = _combine([t.layer for t in types], shares, scale)
    first = _combine([t.first for t in types], shares, scale)
    last = _combine([t.last for t in types], shares, scale)
    fixed = max(t.fixed_bytes * s for t, s in zip(types, scale))
    coefs = [(t.fixed_bytes * s, *(getattr(c, k) * s for c in (t.layer, t.first, t.last) for k in ("static_bytes",
              "act_bytes"))) for t, s in zip(types, scale)]
    exact = any(all(c[i] >= max(x[i] for x in coefs) for i in range(len(c))) for c in coefs)
    return MixedCosts(layer, first, last, fixed, max(t.fixed_sync_s for t in types), c0, types, exact)


def type_memory_bytes(t: TypeCosts, n: int, inflight: float, first: bool, last: bool) -> float:
    """Peak bytes per GPU of one replica type holding n layers with ``inflight`` micro-batches (eq. M2 per
    type, the exact check of eq. H6)."""
    return float(stage_memory(t.fixed_bytes, t.layer.static_bytes, t.layer.act_bytes, n, inflight,
                              (t.first.static_bytes, t.first.act_bytes) if first else None,
                              (t.last.static_bytes, t.last.act_bytes) if last else None))


def boundary_s(est: Any, a: tuple[tuple[str, str, int, int], ...], b: tuple[tuple[str, str, int, int], ...],
               samples: int, cp: int = 1) -> float:
    """Eq. H5: p2p of a boundary between two stages given as (gpu_type, island, tp, dp) per type: the slowest
    pair (a single-type stage is one entry)."""
    return max(est.p2p_time((ga, ia), (gb, ib), samples, ta, tb, dp_a=da, dp_b=db, cp=cp)
               for ga, ia, ta, da in a for gb, ib, tb, db in b)


def replica_boundary_s(est: Any, a: tuple[tuple[str, str, int, float], ...], b: tuple[tuple[str, str, int, float], ...],
                       cp: int = 1) -> float:
    """Eqs. Q1, Q2: the round trip of a boundary between two stages of one dp, given as (gpu_type, island, tp,
    samples per replica) per replica type: replica r of a sends its activation to replica r of b and b its
    gradient back, each way at the sender's samples (``Estimator.replica_send_s``); the slowest type pair
    (eq. H5; exact for single-type stages, where every pair is alike)."""
    return max(est.replica_send_s((ga, ia), (gb, ib), ta * cp, tb * cp, sa)
               + est.replica_send_s((gb, ib), (ga, ia), tb * cp, ta * cp, sb)
               for ga, ia, ta, sa in a for gb, ib, tb, sb in b)


__all__ = ["MixedCosts", "ReplicaKey", "TypeCosts", "boundary_s", "mixed_costs", "replica_boundary_s", "type_memory_bytes"]
