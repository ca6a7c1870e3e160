"""The public estimator: per-stage-option costs for presolve (cached) and whole-plan estimates."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from haap_milp.errors import HaapInputError
from haap_milp.estimator import comm, compute, costs, hardware, memory, mixed, runtime, zero
from haap_milp.estimator.calibration import Calibration, load_calibration
from haap_milp.estimator.flops import model_flops_per_sample
from haap_milp.estimator.kernels import MODERN, Implementation
from haap_milp.estimator.override import apply_profile
from haap_milp.estimator.plan_estimate import estimate_plan
from haap_milp.estimator.profiles import Profile
from haap_milp.estimator.results import GIB, ComputeBound, PlanEstimate, StageCost
from haap_milp.network import pricing
from haap_milp.specs import FP32_PRECISIONS, ClusterSpec, ModelSpec, Plan, TrainingSpec

T = TypeVar("T")
_MISS = object()


@functools.cache
def _default_calibration() -> Calibration:
    return load_calibration()


def _same_model(profile, model) -> None:
    """A profile's per-layer times and memory belong to the model it was measured on: its layer count (every
    format) and, for a native profile, its shapes must be the model's. Before, a mismatch was a log line and the
    plan was priced on another model's layers (OPT-350M's profile on llama3-70b: MFU 994 %)."""
    shape = (profile.meta.get("header") or {}).get("model") or {}
    mine = {"num_layers": model.num_layers, "hidden": model.hidden, "ffn_hidden": model.ffn_hidden,
            "num_heads": model.num_heads, "num_kv_heads": model.kv_heads, "vocab_size": model.vocab_size}
    theirs = {"num_layers": profile.num_layers, **{k: shape.get(k) for k in mine if k != "num_layers"}}
    for key, want in mine.items():
        got = theirs[key]
        if got is not None and got != want:
            raise HaapInputError(
                f"--profile was measured on {shape.get('name') or 'a model'} with {key}={got}; model {model.name} "
                f"has {key}={want}. A profile's layer times belong to the model it was measured on: measure this "
                f"one (`haap-solve profile -m {model.name}`) or drop --profile.", field="--profile", value=got)


class Estimator:
    """Time and memory of any stage option and any plan on ``cluster`` (docs/DESIGN.md, step 2).

    Per-stage costs follow problem.py eq. T1/M2: a stage with n layers costs
    ``n·layer_cost + [first]·first_stage_extra + [last]·last_stage_extra`` in time, memory (plus
    ``stage_fixed_bytes``) and sync (plus ``stage_fixed_sync_s``). Every result is cached on its
    hashable arguments ("state caching"); ``cache_stats()`` gives hits and misses per function.
    """

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                 calibration: Calibration | None = None, profile: Profile | None = None, *,
                 impl: Implementation = MODERN, p2p_model: str = "group"):
        self.model, self.cluster, self.training = model, cluster, training
        self.runtime = runtime.resolve(training)  # fixed per estimator (with_training makes a new one)
        if training.precision in FP32_PRECISIONS and impl.flash_attention:
            # FlashAttention runs in fp16/bf16 only (Dao-AILab/flash-attention README); fp32 training takes the
            # unfused path (s x s scores stored, batched GEMMs at the fp32 / tf32 rate)
            impl = replace(impl, flash_attention=False)
        self.impl = impl
        if p2p_model not in ("group", "per_gpu"):
            raise HaapInputError(f"p2p_model={p2p_model!r} must be 'group' or 'per_gpu'.", field="p2p_model")
        self.p2p_model = p2p_model
        self.calibration = calibration if calibration is not None else _default_calibration()
        self.profile = profile
        self.moe_fraction = model.num_moe_layers / model.num_layers  # computed once: a property that loops layers
        if profile is not None and profile.seq_len and profile.seq_len != training.seq_len:
            raise HaapInputError(f"profile was measured at seq_len={profile.seq_len}, training uses "
                                 f"{training.seq_len}; profile times do not transfer.", field="profile.seq_len",
                                 value=profile.seq_len)
        if profile is not None and profile.meta.get("precision", training.precision) != training.precision:
            raise HaapInputError(f"profile points are at precision {profile.meta['precision']}, training uses "
                                 f"{training.precision}.", field="profile.precision", value=profile.meta["precision"])
        if profile is not None:
            _same_model(profile, model)
        self._cache: dict[str, dict[Any, Any]] = {}
        self._hits: Counter[str] = Counter()
        self._misses: Counter[str] = Counter()

    # ------------------------------------------------------------------ caching
    def _memo(self, name: str, key: Any, fn: Callable[[], T]) -> T:
        cache = self._cache.setdefault(name, {})
        value = cache.get(key, _MISS)
        if value is _MISS:
            self._misses[name] += 1
            value = cache[key] = fn()
        else:
            self._hits[name] += 1
        return value  # type: ignore[return-value]

    def cache_stats(self) -> dict[str, int]:
        """Hits and misses per cached function (``<name>_hits``, ``<name>_misses``) and totals."""
        out: dict[str, int] = {}
        for name in sorted(set(self._hits) | set(self._misses)):
            out[f"{name}_hits"], out[f"{name}_misses"] = self._hits[name], self._misses[name]
        out["hits"], out["misses"] = sum(self._hits.values()), sum(self._misses.values())
        return out

    def hardware(self, gpu_type: str, island: str | None = None) -> hardware.Hardware:
        return self._memo("hardware", (gpu_type, island),
                          lambda: hardware.resolve(self.cluster, self.calibration, gpu_type, island))

    def replica_island(self, gpu_type: str, island: str) -> str:
        """The first island (cluster order) whose single-replica layer prices of ``gpu_type`` are this island's: the
        ``layer_cost`` of dp = cp = ep = etp = 1 (eq. H7's split search reads only these). Such a price reads no NIC
        (tp stays in a node; one replica has no DP sync; no CP ring, no EP exchange), so islands whose nodes agree
        inside (GPU, fitted parameters, GPUs a node, NVLink, the measured intra-node links) price it alike. Only
        for models without MoE layers (an MoE layer's expert gradients sync over tp ranks: kept apart, unproven)."""
        return self._memo("replica_island", (gpu_type, island), lambda: self._replica_island(gpu_type, island))

    def _replica_island(self, gpu_type: str, island: str) -> str:
        if self.moe_fraction > 0:
            return island
        hw = self.hardware(gpu_type, island)
        for other in dict.fromkeys(g.island for g in self.cluster.node_groups if g.gpu.name == gpu_type):
            if other == island:
                break
            if hardware.same_inside(hw, self.hardware(gpu_type, other)):
                return other
        return island

    def _config(self, gpu_type: str, tp: int, dp: int, ep: int, etp: int, recompute: str, samples: int,
                island: str | None, cp: int, zero: int | None = None) -> tuple[costs.StageConfig, hardware.Hardware]:
        hw = self.hardware(gpu_type, island)
        hardware.check_stage(self.model, hw, self.training.precision, tp, dp, ep, etp, cp, samples, recompute)
        return costs.StageConfig(gpu_type, island, tp, dp, ep, etp, recompute, samples, cp, self._zero(zero)), hw

    def _zero(self, zero: int | None) -> int | None:
        """A stage's ZeRO stage as a cache key: None when it is the runtime's own (so explicit and implicit share
        prices), else the stage (estimator/zero.py; formulations/ eq. Z1)."""
        if zero is None or zero == self.runtime.zero_stage:
            return None
        if zero not in (0, 1, 2, 3):
            raise HaapInputError(f"zero={zero!r}: a ZeRO stage is 0, 1, 2 or 3.", field="zero", value=zero)
        return zero

    # ------------------------------------------------------------------ per-layer costs
    def layer_cost(self, gpu_type: str, tp: int, dp: int, ep: int, etp: int, recompute: str,
                   samples_per_microbatch: int, *, island: str | None = None, cp: int = 1,
                   zero: int | None = None) -> StageCost:
        """One decoder layer (mean over dense/MoE layers) on one GPU of a stage, one micro-batch of B samples
        split over dp replicas. ``island`` None: the slowest NIC share of that GPU type counts. ``zero``: the
        stage's ZeRO stage (None: the runtime's)."""
        key = (gpu_type, tp, dp, ep, etp, recompute, samples_per_microbatch, island, cp, self._zero(zero))
        return self._memo("layer_cost", key, lambda: self._layer_cost(*key))

    def _layer_cost(self, gpu_type, tp, dp, ep, etp, recompute, samples, island, cp, zero=None) -> StageCost:
        c, hw = self._config(gpu_type, tp, dp, ep, etp, recompute, samples, island, cp, zero)
        cost = self._analytic_layer(c, hw)
        none = self._analytic_layer(replace(c, recompute="none"), hw) if recompute != "none" else cost
        return apply_profile(self.profile, "layer", cost, c, none)

    def _analytic_layer(self, c: costs.StageConfig, hw: hardware.Hardware) -> StageCost:
        """Mean over the model's dense and MoE decoder layers (layer-kind passes cached across dp, the DP sync
        across micro-batches and recompute; the whole per config: a recompute option's layer_cost prices its
        recompute-none twin too)."""
        return self._memo("analytic_layer", c, lambda: self._analytic_layer_uncached(c, hw))

    def _analytic_layer_uncached(self, c: costs.StageConfig, hw: hardware.Hardware) -> StageCost:
        frac = self.moe_fraction
        parts = []
        for moe, w in ((False, 1.0 - frac), (True, frac)):
            if w <= 0:
                continue
            pkey = (moe, c.gpu_type, c.island, c.tp, c.ep, c.etp, c.micro_batch, c.cp)
            passes = self._memo("layer_passes", pkey,
                                lambda: costs.decoder_passes(self.model, moe, c, hw, self.training, self.impl))  # noqa: B023
            tokens = c.samples * self.training.seq_len  # (the stage's micro-batch: its FLOPs, cached on it alone)
            fl = self._memo("layer_flops", (moe, tokens), lambda: costs.layer_flops(self.model, moe, tokens,  # noqa: B023
                                                                                  self.training.seq_len))
            cost = costs.decoder_cost(self.model, moe, c, hw, self.training, self.calibration, passes, self.impl,
                                      self._sync("layer", c, hw, moe), fl)
            parts.append(cost if w == 1.0 else cost.scaled(w))
        return parts[0] if len(parts) == 1 else parts[0] + parts[1]

    def _sync(self, part: str, c: costs.StageConfig, hw: hardware.Hardware, moe: bool = False) -> costs.Sync:
        """The DP sync of a decoder layer (``part`` "layer", dense or ``moe``), the embedding or the LM head at config
        ``c``, cached on what it reads (eq. O2f): GPU type, island, tp, dp, cp, ep, etp, ZeRO stage, and not the
        recompute mode or micro-batch, which multiply the options presolve prices (all dimensions on, Mixtral-8x7B
        on 16 H100: 29,520 param_sync calls, 184 distinct)."""
        key = (part, moe, c.gpu_type, c.island, c.tp, c.dp, c.cp, c.ep if part == "layer" else 1,
               c.etp if part == "layer" else 1, c.zero)
        m, tr, cal = self.model, self.training, self.calibration
        fn = {"layer": lambda: costs.decoder_sync(m, moe, c, hw, tr, cal),
              "embedding": lambda: costs.embedding_sync(m, c, hw, tr, cal),
              "head": lambda: costs.head_sync(m, c, hw, tr, cal)}[part]
        return self._memo("param_sync", key, fn)

    def first_stage_extra(self, gpu_type: str, tp: int, dp: int, ep: int, etp: int, recompute: str,
                          samples_per_microbatch: int, *, island: str | None = None, cp: int = 1,
                          zero: int | None = None) -> StageCost:
        """Input embedding (+ its gradients and optimizer state) on the first stage."""
        key = (gpu_type, tp, dp, ep, etp, recompute, samples_per_microbatch, island, cp, self._zero(zero))

        def run() -> StageCost:
            c, hw = self._config(*key)
            cost = costs.embedding_cost(self.model, c, hw, self.training, self.calibration, self._sync("embedding", c, hw))
            return apply_profile(self.profile, "embedding", cost, c, None)

        return self._memo("first_stage_extra", key, run)

    def last_stage_extra(self, gpu_type: str, tp: int, dp: int, ep: int, etp: int, recompute: str,
                         samples_per_microbatch: int, *, island: str | None = None, cp: int = 1,
                         zero: int | None = None) -> StageCost:
        """Final norm + LM head + loss on the last stage."""
        key = (gpu_type, tp, dp, ep, etp, recompute, samples_per_microbatch, island, cp, self._zero(zero))

        def run() -> StageCost:
            c, hw = self._config(*key)
            cost = costs.head_cost(self.model, c, hw, self.training, self.calibration, self.impl,
                                   self._sync("head", c, hw))
            return apply_profile(self.profile, "head", cost, c, None)

        return self._memo("last_stage_extra", key, run)

    def stage_fixed_bytes(self, gpu_type: str, tp: int, *, dp: int = 1, recompute: str = "none",
                          samples_per_microbatch: int | None = None, cp: int = 1, etp: int = 1, ep: int = 1,
                          zero: int | None = None) -> float:
        """Per-stage memory independent of its layer count: framework reserve per GPU (CUDA context, NCCL
        buffers, workspaces: ``GlobalParams.overhead_gib``, source in calibration.PRIOR_SOURCES['overhead_gib'])
        and, with ``samples_per_microbatch`` given, the once-per-stage transients (``_transient_bytes``:
        recomputed layer, MoE dispatch buffers - ``ep`` matters only to the allgather dispatcher - and
        allocator fragmentation), and at ZeRO-3 the gathered parameters of two layers (eq. Z5)."""
        key = (gpu_type, tp, dp, recompute, samples_per_microbatch, cp, etp, ep, self._zero(zero))

        def run() -> float:
            self.hardware(gpu_type)  # validates the type
            fixed = self.calibration.globals.overhead_gib * GIB
            if samples_per_microbatch:
                fixed += self._transient_bytes(tp, dp, recompute, samples_per_microbatch, cp, etp, ep)
            z = self.runtime.zero_stage if key[-1] is None else key[-1]
            if z == 3 and dp * cp > 1:
                fixed += self._gathered_bytes(tp, ep, etp)
            return fixed

        return self._memo("stage_fixed_bytes", key, run)

    def _gathered_bytes(self, tp: int, ep: int, etp: int) -> float:
        """Eq. Z5 for one GPU: a decoder layer's parameters on it before sharding (mean over dense / MoE layers),
        gathered twice in 16-bit and once as gradients."""
        m, frac = self.model, self.moe_fraction
        dense = memory.dense_layer_params_per_gpu(m, tp)
        per_gpu = (1 - frac) * dense + (frac * sum(memory.moe_layer_params_per_gpu(m, tp, ep, etp)) if frac else 0.0)
        prec = self.training.precision
        return zero.gathered_bytes(3, per_gpu, compute.act_bytes(prec), costs.grad_bytes(prec))

    def _transient_bytes(self, tp: int, dp: int, recompute: str, samples: int, cp: int, etp: int,
                         ep: int = 1) -> float:
        """Once-per-stage transients of one micro-batch: the recomputed layer's activations, the MoE dispatch
        buffers, and allocator fragmentation (memory.py)."""
        b, seq, impl = samples / dp, self.training.seq_len, self.impl
        sp = self.training.sequence_parallel and tp > 1
        a = compute.act_bytes(self.training.precision)
        moe = self.moe_fraction > 0
        g = memory.gemm_input_bytes(self.training.precision)
        out = memory.recompute_working_bytes(self.model, moe, b, seq, tp, sp, recompute, cp, etp, impl, a, g)
        out += memory.dispatcher_buffer_bytes(self.model, b, seq, tp, ep, cp, impl, a)
        big = memory.largest_allocation_bytes(self.model, b, seq, tp, cp, etp, impl, a)
        return out + memory.fragmentation_bytes(big, self.calibration.globals.frag_fraction)

    def stage_fixed_sync_s(self, gpu_type: str, island: str | None, tp: int, dp: int, *, cp: int = 1,
                           ep: int = 1, etp: int = 1, zero: int | None = None) -> float:
        """Per-stage latency part of the exposed DP sync (one start-up per collective, not per layer)."""
        key = (gpu_type, island, tp, dp, cp, ep, etp, self._zero(zero))

        def run() -> float:
            hw = self.hardware(gpu_type, island)
            c = costs.StageConfig(gpu_type, island, tp, dp, ep, etp, "none", dp, cp, key[-1])
            return costs.dp_latency_s(self.model, c, hw, self.training, self.calibration)

        return self._memo("stage_fixed_sync_s", key, run)

    def mixed_costs(self, replicas: tuple[mixed.ReplicaKey, ...], ep: int, recompute: str, *,
                    cp: int = 1) -> mixed.MixedCosts:
        """A mixed stage's prices (estimator/mixed.py, formulations/ eqs. H3-H6): ``replicas`` as
        (gpu_type, island, tp, count, samples per replica per micro-batch), in the stage's order."""
        key = (tuple(replicas), ep, recompute, cp)
        return self._memo("mixed_costs", key, lambda: mixed.mixed_costs(self, tuple(replicas), ep, recompute, cp))

    def usable_memory_bytes(self, gpu_type: str) -> float:
        """Capacity x (1 - training.memory_headroom_fraction)."""
        gpu = self.hardware(gpu_type).gpu
        return gpu.memory_gib * GIB * (1.0 - self.training.memory_headroom_fraction)

    def p2p_time(self, group_a: tuple[str, str], group_b: tuple[str, str], samples_per_microbatch: int,
                 tp_a: int = 1, tp_b: int = 1, *, dp_a: int | None = None, dp_b: int | None = None,
                 cp: int = 1) -> float:
        """Forward activations a -> b plus backward gradients b -> a of one micro-batch (B samples; 16-bit, or
        4-byte in fp32 / tf32 training).

        Eq. Q1 (sends block, ``dp_a == dp_b`` given): replica r of a sends its own B/dp samples to replica r
        of b and back, each replica's tp GPUs carrying its message together (``replica_send_s``).
        Otherwise every sending GPU moves its share of the micro-batch over its own share of its node's NICs
        (rail-optimised nodes, Megatron scatter/gather), so the rate is (number of GPUs on the narrower
        side) x NIC share per GPU. ``p2p_model="per_gpu"`` with ``dp_a``/``dp_b`` given: that number is
        min(tp_a·dp_a, tp_b·dp_b)·cp, exact for the plan. ``"group"`` (default; what problem.py's
        group-pair table can hold, so presolve's objective equals ``estimate``): it is the GPU count of the
        smaller of the two node groups - exact when stages fill their groups, optimistic for stages much
        smaller than their group; under a runtime with blocking sends (runtime.py) at most B streams.
        Between islands the island link, shared by all senders, also bounds the rate; latencies: NIC (+ island
        link)."""
        if self.p2p_blocking and dp_a is not None and dp_a == dp_b and self.p2p_model == "group":
            per = samples_per_microbatch / dp_a  # eq. Q1: B / dp samples per replica
            return (self.replica_send_s(group_a, group_b, tp_a * cp, tp_b * cp, per)
                    + self.replica_send_s(group_b, group_a, tp_b * cp, tp_a * cp, per))
        streams = None
        if self.p2p_model == "per_gpu" and dp_a is not None and dp_b is not None:
            streams = min(tp_a * dp_a, tp_b * dp_b) * cp
        key = (group_a, group_b, samples_per_microbatch, streams)
        return self._memo("p2p_time", key, lambda: self._p2p(group_a, group_b, samples_per_microbatch, streams))

    def replica_send_s(self, group_a: tuple[str, str], group_b: tuple[str, str], gpus_a: int, gpus_b: int,
                       samples: float) -> float:
        """Eq. Q1: one way, one data-parallel replica of ``gpus_a`` GPUs (tp·cp) of group a sends the activation
        of its ``samples`` samples (x bytes) to its partner replica of ``gpus_b`` GPUs of group b.

        Each end's n = min(GPUs of the replica, GPUs per node) GPUs carry x together (DeepSpeed pairs the dp
        ranks of neighbouring stages one to one; a replica's tp GPUs split the message), so an end's rate is the
        measured figure with n senders of its own type (``inter_node``; n = 1: one GPU's stream), read at x
        bytes - what n GPUs move together -, and the pair gets the slower end; two types with as many GPUs on
        both ends use the measured ``cross_type`` figure when there is one. This is the pricing of Sailor's
        runtime simulator (``estimate_send_time`` at ``bandwidths[g][min(tp, 4)][g'][min(tp', 4)]``,
        validated on its authors' Fig. 8b cluster: its table between two VM sizes is the smaller side's own
        curve, and between two types at one size the slower type's). Other replicas sharing the node's NIC
        are not charged (as that simulator; on that cluster four 1-GPU streams reach 3.7x one stream).
        Replicas spanning nodes (n > GPUs per node) use each node's figure for their node's part. Without a
        measured figure: n x the datasheet NIC share per GPU. Between islands the island link also bounds the
        rate and adds its latency (as ``round_trip_s``)."""
        key = (group_a, group_b, gpus_a, gpus_b, samples)
        return self._memo("replica_send_s", key, lambda: self._replica_send(group_a, group_b, gpus_a, gpus_b,
                                                                          samples))

    def _replica_send(self, ga, gb, gpus_a: int, gpus_b: int, samples: float) -> float:
        x = samples * self.training.seq_len * self.model.hidden * compute.act_bytes(self.training.precision)
        if x <= 0:
            return 0.0
        hw_a, hw_b = self.hardware(*ga), self.hardware(*gb)
        ends = [(hw_a, max(1, gpus_a)), (hw_b, max(1, gpus_b))]
        net = hw_a.network
        cross = ()
        if net is not None and hw_a.gpu.name != hw_b.gpu.name and min(gpus_a, hw_a.gpus_per_node) == \
                min(gpus_b, hw_b.gpus_per_node):
            cross = pricing.links_of(net, "cross_type", (hw_a.gpu.name, hw_b.gpu.name), ga[1])
        rates, lats = [], []
        if cross:
            n = min(gpus_a, hw_a.gpus_per_node)
            nodes = -(-gpus_a // hw_a.gpus_per_node)
            got = pricing.aggregate_gbps(cross, n, x / nodes)
            rates.append(nodes * got[0] * 1e9)
            lats.append(got[1])
        else:
            for hw, gpus in ends:
                n, nodes = min(gpus, hw.gpus_per_node), -(-gpus // hw.gpus_per_node)
                links = pricing.links_of(net, "inter_node", (hw.gpu.name,), hw.group.island) if net else ()
                got = pricing.aggregate_gbps(links, n, x / nodes)
                if got is None:  # datasheet: n GPUs' shares of the node's NICs
                    rates.append(nodes * n * hw.nic_gpu.bytes_per_s)
                    lats.append(hw.nic_gpu.latency_s)
                else:
                    rates.append(nodes * got[0] * 1e9)
                    lats.append(got[1])
        rate, lat = min(rates), max(lats)
        if ga[1] != gb[1]:
            measured = pricing.aggregate_gbps(pricing.island_links_of(net, ga[1], gb[1]), 1, x) if net else None
            link = self.cluster.island_link(ga[1], gb[1])
            if measured is not None:
                rate, lat = min(rate, measured[0] * 1e9), lat + measured[1]
            elif link is not None:
                rate = min(rate, link.bandwidth_gbps * 1e9 * min(hw_a.params.nic_eff, hw_b.params.nic_eff))
                lat += link.latency_us * 1e-6
        return x / rate + lat

    def _p2p(self, ga, gb, samples, streams) -> float:
        # activations of B samples: 16-bit, or 4-byte in fp32 / tf32 training
        total = samples * self.training.seq_len * self.model.hidden * compute.act_bytes(self.training.precision)
        if streams is None:
            streams = min(self._group_gpus(ga), self._group_gpus(gb))
            if self.p2p_blocking:
                # blocking sends put c_j into the period (eq. T2b), so the group table must not count a
                # 96-GPU group's GPUs as senders of a 16-replica stage: at most one stream per replica of
                # tp 1 and micro-batch 1 (dp = B) - exact there; tp > 1 stages really split it further
                streams = min(streams, samples)
        return self.round_trip_s(ga, gb, total, streams)

    def round_trip_s(self, ga: tuple[str, str], gb: tuple[str, str], total: float, streams: int) -> float:
        """Seconds to send ``total`` bytes from group ``ga`` to ``gb`` and the same back over ``streams`` GPU
        pairs (the p2p price of eq. T1's c_j; re-planning's migration uses half of it for one way)."""
        hw_a, hw_b = self.hardware(*ga), self.hardware(*gb)
        link = self.cluster.island_link(ga[1], gb[1]) if ga[1] != gb[1] else None
        measured = pricing.p2p_round_trip_s(hw_a, hw_b, total, streams, link)  # None: no measured figure
        if measured is not None:
            return measured
        rate = min(hw_a.nic_gpu.bytes_per_s, hw_b.nic_gpu.bytes_per_s) * streams
        lat = max(hw_a.nic_gpu.latency_s, hw_b.nic_gpu.latency_s)
        if link is not None:
            rate = min(rate, link.bandwidth_gbps * 1e9 * min(hw_a.params.nic_eff, hw_b.params.nic_eff))
            lat += link.latency_us * 1e-6
        return 2.0 * comm.p2p(comm.Link(rate, lat)).time(total)

    @property
    def p2p_per_replica(self) -> bool:
        """Eq. Q1: under a runtime whose sends block (DeepSpeed), every stage has the same dp (its PipelineEngine
        lays the ranks out as one pp x dp grid, ``PipeModelDataParallelTopology``), and replica r of stage j sends its own B/dp samples to replica r of stage j+1 over one
        GPU's stream (DeepSpeed's PipelineEngine pairs the dp ranks of neighbouring stages one to one; Sailor's
        simulator prices each replica's send alike). The boundary is then priced per replica pair
        (``replica_send_s``: the replicas' tp GPUs carry the message together), with the stage's dp known:
        presolve splits each micro-batch variant by dp (one dp per variant) and gives every (group, tp) its own
        p2p endpoint so its table holds it. Otherwise the group-pair model (``p2p_time``'s docstring) applies."""
        return self.p2p_blocking  # one dp per plan: ``--uniform dp`` is implied (and harmless when given)

    @property
    def p2p_blocking(self) -> bool:
        """Whether the runtime's pipeline sends block their stages (runtime.py; pipeline.py eq. T2b)."""
        return self.runtime.p2p_blocking

    def _group_gpus(self, group: tuple[str, str]) -> int:
        return sum(g.num_gpus for g in hardware.node_groups(self.cluster, group[0], group[1]))

    # ------------------------------------------------------------------ whole plan
    def estimate(self, plan: Plan) -> PlanEstimate:
        """Whole-plan estimate (schedule.py closed forms; 1F1B = problem.py eq. T1 exactly)."""
        est = self._for_plan(plan)
        return estimate_plan(est, plan)

    def _for_plan(self, plan: Plan) -> Estimator:
        """This estimator, or a sibling whose TrainingSpec follows the plan's batch/precision/flags."""
        t = self.training
        upd = {"global_batch_size": plan.global_batch_size, "seq_len": plan.seq_len, "precision": plan.precision,
               "sequence_parallel": plan.sequence_parallel, "distributed_optimizer": plan.distributed_optimizer}
        if all(getattr(t, k) == v for k, v in upd.items()):
            return self
        return Estimator(self.model, self.cluster, t.model_copy(update=upd), self.calibration, self.profile,
                         impl=self.impl, p2p_model=self.p2p_model)

    def compute_bound(self) -> ComputeBound:
        """Throughput if every GPU ran its GEMMs at its calibrated best efficiency on model FLOPs, perfectly
        balanced, with no communication, bubble or recomputation."""
        prec = self.training.precision
        per_type: dict[str, float] = {}
        for name, count in self.cluster.gpus_per_type.items():
            gpu = self.cluster.gpu(name)
            rate = compute.gemm_rate(gpu, self.calibration.params(gpu), prec)
            per_type[name] = count * rate / 1e12
        total = sum(per_type.values()) * 1e12
        per_sample = model_flops_per_sample(self.model, self.training.seq_len)
        if total <= 0:
            return ComputeBound(0.0, float("inf"), 0.0, per_type)
        it = self.training.global_batch_size * per_sample / total
        return ComputeBound(self.training.global_batch_size * self.training.seq_len / it, it, total / 1e12, per_type)

    def with_calibration(self, calibration: Calibration) -> Estimator:
        return Estimator(self.model, self.cluster, self.training, calibration, self.profile, impl=self.impl,
                         p2p_model=self.p2p_model)

    def with_training(self, **update: Any) -> Estimator:
        return Estimator(self.model, self.cluster, self.training.model_copy(update=update), self.calibration,
                         self.profile, impl=self.impl, p2p_model=self.p2p_model)

