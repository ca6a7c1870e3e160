"""Where a stage runs: GPU spec, fitted parameters, node group and the achievable links."""

from __future__ import annotations

from dataclasses import dataclass

from haap_milp.errors import HaapInputError
from haap_milp.estimator.calibration import Calibration, GpuParams
from haap_milp.estimator.comm import Link
from haap_milp.network import pricing
from haap_milp.network.spec import MeasuredNetwork
from haap_milp.parallel_rules import ep_divides_experts, ep_fits_grid, tp_divides_heads, tp_fits_node
from haap_milp.specs import ClusterSpec, GPUSpec, ModelSpec, NodeGroup


@dataclass(frozen=True)
class Hardware:
    """One (GPU type, island): the slowest node group of that type there (NIC share per GPU)."""

    gpu: GPUSpec
    params: GpuParams
    group: NodeGroup
    nvlink: Link  # per GPU, one direction, achievable
    nic_node: Link  # all NICs of a node together, achievable
    nic_gpu: Link  # one GPU's share of its node's NICs
    network: MeasuredNetwork | None = None  # measured links (cluster.network): used as given where they apply

    @property
    def gpus_per_node(self) -> int:
        return self.group.gpus_per_node

    # Links at a message size (network/pricing.py); without a measured figure: the datasheet links above.
    def intra(self, message_bytes: float, n: int, op: str = "all_reduce") -> Link:
        """Per-GPU link of a collective among n GPUs of one node."""
        if self.network is None:
            return self.nvlink
        links = pricing.links_of(self.network, "intra_node", (self.gpu.name,), self.group.island)
        return pricing.intra_link(links, n, message_bytes, self.nvlink, op)

    def tp_ring_step(self, message_bytes: float, n: int) -> tuple[Link, float]:
        """(link, bytes at which it was read) for a ring all-reduce of ``message_bytes`` among n GPUs of one node
        (tensor parallelism). A measured all-reduce figure (nccl-tests busbw) is read at the message size; a
        figure measured as one GPU's point-to-point stream with n GPUs of the node sending (Sailor's
        intra_node_bandwidths.json) is read at the size each ring step actually sends, M / n: a ring is
        2(n-1) such steps (Thakur et al. 2005; Sailor's ``estimate_ar_time`` is the same sum), the rule the DP
        ring already follows (comm.ring_measured). Without measured intra-node links: the datasheet NVLink."""
        if self.network is None or n <= 1:
            return self.nvlink, message_bytes
        links = pricing.links_of(self.network, "intra_node", (self.gpu.name,), self.group.island)
        if links and not any(lk.op == "all_reduce" for lk in links) and any(lk.op == "p2p" for lk in links):
            chunk = message_bytes / n
            return self.intra(chunk, n, "p2p"), chunk
        return self.intra(message_bytes, n), message_bytes

    def nic_gpu_at(self, message_bytes: float, op: str = "p2p", k: int | None = None) -> Link:
        """One GPU's share of the inter-node network while k (default: all) GPUs of its node send."""
        if self.network is None:
            return self.nic_gpu
        links = pricing.links_of(self.network, "inter_node", (self.gpu.name,), self.group.island)
        return pricing.per_gpu_link(links, k or self.gpus_per_node, message_bytes, self.nic_gpu, op)

    def dp_links(self, kind: str, n: int, span: int, element_bytes: float,
                 bucket_bytes: float | None = None) -> tuple[Link, Link]:
        """(intra-node link, whole-node link) of a DP collective over n ranks spaced span apart, at one bucket
        (``bucket_bytes``: the runtime's bucket; None: the network's or Megatron's rule)."""
        if self.network is None:
            return self.nvlink, self.nic_node
        size = bucket_bytes or pricing.dp_bucket_bytes(self.network, n, element_bytes)
        inter = pricing.links_of(self.network, "inter_node", (self.gpu.name,), self.group.island)
        r = max(1, min(n, self.gpus_per_node // max(span, 1)))
        return (self.intra(size, r, kind),
                pricing.node_link(inter, self.gpus_per_node, size, self.nic_node, kind))

    def ring_step_link(self, chunk_bytes: float, n: int, span: int, kind: str = "all_reduce") -> Link:
        """The link of one step of a flat ring over n ranks spaced span apart (DeepSpeed's DP all-reduce):
        inside a node when the ring fits in one, else one GPU's stream to the next node while the span rings
        of a tensor-parallel group cross the node's NIC at once (pricing.ring_senders)."""
        if n * span <= self.gpus_per_node:
            return self.intra(chunk_bytes, n, kind)
        k = pricing.ring_senders(span, self.gpus_per_node)
        if self.network is None:
            return self.nic_gpu  # datasheet: this GPU's share of the node's NICs
        links = pricing.links_of(self.network, "inter_node", (self.gpu.name,), self.group.island)
        return pricing.per_gpu_link(links, k, chunk_bytes, self.nic_gpu, kind)


def same_inside(a: Hardware, b: Hardware) -> bool:
    """Whether two (GPU type, island)s agree on everything a node's inside prices read: the GPU, its fitted
    parameters, GPUs a node, NVLink and the measured intra-node links (not the NICs or inter-node links)."""
    inside = (pricing.links_of(a.network, "intra_node", (a.gpu.name,), a.group.island)
              == pricing.links_of(b.network, "intra_node", (b.gpu.name,), b.group.island))
    return (a.gpu == b.gpu and a.params == b.params and a.gpus_per_node == b.gpus_per_node and a.nvlink == b.nvlink
            and inside)


def node_groups(cluster: ClusterSpec, gpu_type: str, island: str | None) -> list[NodeGroup]:
    groups = [g for g in cluster.node_groups if g.gpu.name == gpu_type and (island is None or g.island == island)]
    if not groups:
        where = f" on island {island!r}" if island is not None else ""
        have = sorted({f"{g.gpu.name}@{g.island}" for g in cluster.node_groups})
        raise HaapInputError(
            f"GPU type {gpu_type!r}{where} is not in cluster {cluster.name!r} (it has {', '.join(have)}).",
            field="gpu_type", value=gpu_type)
    return groups


def resolve(cluster: ClusterSpec, cal: Calibration, gpu_type: str, island: str | None) -> Hardware:
    """Hardware of ``gpu_type`` (on ``island``; None: any island, the slowest NIC share counts)."""
    groups = node_groups(cluster, gpu_type, island)
    group = min(groups, key=lambda g: (g.nic_bandwidth_gbps / g.gpus_per_node, g.gpus_per_node))
    gpu = group.gpu
    p = cal.params(gpu)
    nvlink = Link(gpu.intra_node_bandwidth_gbps * 1e9 * p.nvlink_eff, cal.globals.intra_latency_s)
    nic_node = Link(group.nic_bandwidth_gbps * 1e9 * p.nic_eff, group.nic_latency_us * 1e-6)
    nic_gpu = Link(nic_node.bytes_per_s / group.gpus_per_node, nic_node.latency_s)
    return Hardware(gpu, p, group, nvlink, nic_node, nic_gpu, cluster.network)


def check_stage(model: ModelSpec, hw: Hardware, precision: str, tp: int, dp: int, ep: int, etp: int,
                cp: int, samples: int, recompute: str) -> None:
    """Reject impossible stage configurations with one clear paragraph (HaapInputError)."""
    gpu = hw.gpu
    if gpu.peak_tflops(precision) is None:
        have = [p for p in ("fp32", "tf32", "bf16", "fp16", "fp8") if gpu.peak_tflops(p) is not None]
        raise HaapInputError(
            f"GPU {gpu.name!r} does not support precision {precision!r} (it supports {', '.join(have) or 'none'}); "
            "choose a supported precision or leave this GPU type out.", field="precision", value=precision)
    if recompute not in ("none", "selective", "full", "op"):
        raise HaapInputError(f"recompute={recompute!r} is not one of none, selective, full, op.", field="recompute",
                             value=recompute)
    for name, v in (("tp", tp), ("dp", dp), ("ep", ep), ("etp", etp), ("cp", cp), ("samples_per_microbatch", samples)):
        if not isinstance(v, int) or v < 1:
            raise HaapInputError(f"{name}={v!r} must be a positive integer.", field=name, value=v)
    if not tp_fits_node(tp, hw.gpus_per_node):
        raise HaapInputError(
            f"tp={tp} exceeds the {hw.gpus_per_node} GPUs per node of {gpu.name}; tensor parallelism stays inside "
            "a node.", field="tp", value=tp)
    if not tp_divides_heads(model.num_heads, model.kv_heads, tp):
        raise HaapInputError(
            f"tp={tp} must divide the attention heads ({model.num_heads}) and key/value heads ({model.kv_heads}) "
            f"of {model.name}.", field="tp", value=tp)
    if samples % dp:
        raise HaapInputError(
            f"dp={dp} does not divide the {samples} samples per micro-batch; each replica needs a whole number.",
            field="dp", value=dp)
    _check_experts(model, tp, dp, ep, etp, cp)


def _check_experts(model: ModelSpec, tp: int, dp: int, ep: int, etp: int, cp: int) -> None:
    if not model.is_moe:
        if ep > 1 or etp > 1:
            raise HaapInputError(f"ep={ep}, etp={etp}: expert parallelism needs an MoE model; {model.name} is dense.",
                                 field="ep", value=ep)
        return
    if not ep_divides_experts(model.num_experts, ep):
        raise HaapInputError(f"ep={ep} does not divide the {model.num_experts} experts of {model.name}.",
                             field="ep", value=ep)
    if not ep_fits_grid(tp, dp, cp, ep, etp):
        raise HaapInputError(
            f"ep x etp = {ep}x{etp} must divide the stage's tp x dp x cp = {tp}x{dp}x{cp} GPUs (Megatron expert grid).",
            field="ep", value=ep)
