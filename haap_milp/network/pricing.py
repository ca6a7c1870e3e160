"""The link a collective gets from a measured network, at its real message size and sender count.

Every function here returns an ``estimator.comm.Link`` (bytes/s, latency) evaluated for one message size,
so estimator.comm's formulas (ring, hierarchical, all-to-all, p2p) keep their linear ``Cost`` form; the
caller passes the message it really sends (costs.py, layers.py, plan.py). Without a measured link for the
class asked, each function returns the datasheet link it is given, unchanged (same object: bit-identical).

Which message size (one per collective call, bytes per GPU):

* TP all-reduce / all-gather / reduce-scatter: the activation the layer reduces (layers.py);
* DP gradient reduction (all-reduce, or reduce-scatter + all-gather): one bucket - ``dp_bucket_bytes``, else
  Megatron-Core's default ``bucket_size = max(40_000_000, 1_000_000 x dp)`` elements (megatron/core/
  distributed/distributed_data_parallel.py) x the element size - since gradients go out bucket by bucket;
* pipeline p2p: one sending GPU's part of the micro-batch's activation (plan.py);
* all-to-all: one GPU's dispatch buffer; context-parallel ring: one step's K and V.

Sharing (how many GPUs of a node use a node's network at once): ``aggregate_gbps(links, k, size)`` is the
bandwidth k concurrent senders of one node get together. A figure measured with exactly k senders is used
as measured; otherwise min(k x a gpu_stream figure, a node_nic figure): the streams add up until the node's
NICs are full (the stream figure with the most senders <= k; the node figure with the fewest senders >= k,
or the most senders when none has as many). One GPU then gets aggregate / k. DP collectives and the CP ring
run on every GPU of a stage at once (k = GPUs per node); a pipeline p2p has min(streams, GPUs per node)
senders per node; a flat DP ring (DeepSpeed) has ``ring_senders`` = tp: one stream leaves the node per ring.
"""

from __future__ import annotations

from typing import Any

from haap_milp.estimator.comm import Link
from haap_milp.network.spec import MeasuredLink, MeasuredNetwork

MEGATRON_BUCKET_ELEMENTS = 40_000_000  # Megatron-Core DDP default bucket: max(4e7, 1e6 x dp) elements
MEGATRON_BUCKET_PER_RANK = 1_000_000


def links_of(net: MeasuredNetwork | None, link: str, gpu_types: tuple[str, ...], island: str | None
             ) -> tuple[MeasuredLink, ...]:
    """Figures of one class for these GPU types (in order) that apply on ``island`` (None: any)."""
    if net is None:
        return ()
    return tuple(lk for lk in net.links if lk.link == link and lk.gpu_types == gpu_types
                 and (not lk.islands or island is None or lk.islands[0] == island))


def island_links_of(net: MeasuredNetwork | None, src: str, dst: str) -> tuple[MeasuredLink, ...]:
    if net is None:
        return ()
    return tuple(lk for lk in net.links if lk.link == "inter_island" and lk.islands == (src, dst))


def _prefer_op(links: tuple[MeasuredLink, ...], op: str) -> tuple[MeasuredLink, ...]:
    same = tuple(lk for lk in links if lk.op == op)
    return same or links


def aggregate_gbps(links: tuple[MeasuredLink, ...], k: int, message_bytes: float, op: str = "p2p"
                   ) -> tuple[float, float] | None:
    """(GB/s that k concurrent senders of one node get together, latency s); None without figures."""
    links = _prefer_op(links, op)
    if not links:
        return None

    def together(lk: MeasuredLink) -> float:
        bw = lk.bandwidth_gbps(message_bytes)
        return k * bw if lk.per == "gpu_stream" else bw

    exact = [lk for lk in links if lk.senders == k]
    if exact:
        used = [min(exact, key=together)]
    else:
        used = []
        streams = [lk for lk in links if lk.per == "gpu_stream"]
        if streams:
            below = [lk for lk in streams if lk.senders <= k]
            used.append(max(below, key=lambda lk: lk.senders) if below else min(streams, key=lambda lk: lk.senders))
        nodes = [lk for lk in links if lk.per == "node_nic"]
        if nodes:
            above = [lk for lk in nodes if lk.senders >= k]
            used.append(min(above, key=lambda lk: lk.senders) if above else max(nodes, key=lambda lk: lk.senders))
    return min(together(lk) for lk in used), max(lk.latency_us for lk in used) * 1e-6


def per_gpu_link(links: tuple[MeasuredLink, ...], k: int, message_bytes: float, fallback: Link,
                 op: str = "p2p") -> Link:
    """One GPU's share when k GPUs of its node send ``message_bytes`` each at once."""
    agg = aggregate_gbps(links, k, message_bytes, op)
    if agg is None:
        return fallback
    return Link(agg[0] * 1e9 / k, agg[1])


def node_link(links: tuple[MeasuredLink, ...], k: int, message_bytes: float, fallback: Link, op: str) -> Link:
    """What all k GPUs of a node get together (the ``nic_node`` of comm.group_collective)."""
    agg = aggregate_gbps(links, k, message_bytes, op)
    return fallback if agg is None else Link(agg[0] * 1e9, agg[1])


def intra_link(links: tuple[MeasuredLink, ...], n: int, message_bytes: float, fallback: Link, op: str) -> Link:
    """Per-GPU bus bandwidth of a collective among n GPUs of one node: the figure measured with n GPUs, else
    the nearest larger group, else the largest. A gpu_stream figure is per GPU (nccl-tests busbw); a node_nic
    one is split over its senders."""
    links = _prefer_op(links, op)
    if not links or n <= 1:
        return fallback
    above = [lk for lk in links if lk.senders >= n]
    lk = min(above, key=lambda x: x.senders) if above else max(links, key=lambda x: x.senders)
    bw = lk.bandwidth_gbps(message_bytes)
    if lk.per == "node_nic":
        bw /= lk.senders
    return Link(bw * 1e9, lk.latency_us * 1e-6)


def ring_senders(span: int, gpus_per_node: int) -> int:
    """GPUs of one node sending across its NIC at each step of a flat DP ring whose ranks are ``span`` GPUs
    apart (span = tp): the replicas a node holds are consecutive in the ring (DeepSpeed's and Megatron's rank
    order put the dp index just outside tp), so each ring leaves the node once; the node holds ``span`` such
    rings (one per tensor-parallel rank), which step together."""
    return max(1, min(span, gpus_per_node))


def dp_bucket_bytes(net: MeasuredNetwork, dp: int, element_bytes: float) -> float:
    if net.dp_bucket_bytes is not None:
        return net.dp_bucket_bytes
    return max(MEGATRON_BUCKET_ELEMENTS, MEGATRON_BUCKET_PER_RANK * dp) * element_bytes


def p2p_round_trip_s(hw_a: Any, hw_b: Any, total_bytes: float, streams: int, island_link: Any) -> float | None:
    """Forward a -> b plus backward b -> a of ``total_bytes`` sent as ``streams`` concurrent GPU streams
    (estimator.cost_model's p2p_time), each direction priced on its own measured figure; None when the network
    has no figure for this pair (the caller's datasheet path applies unchanged).

    Between two GPU types a cross_type figure (sender type first) is used; without one, the slower of the
    two types' inter_node figures (a type without one: its datasheet NIC share). Each node has
    min(streams, GPUs per node) senders. Between islands an inter_island figure (or else the datasheet
    island link x NIC efficiency, as without measurements) bounds the total rate and adds its latency."""
    if hw_a.network is None or total_bytes <= 0:
        return None
    there, used_ab = _one_way(hw_a, hw_b, total_bytes, streams, island_link)
    back, used_ba = _one_way(hw_b, hw_a, total_bytes, streams, island_link)
    return there + back if used_ab or used_ba else None


def _one_way(src: Any, dst: Any, total_bytes: float, streams: int, island_link: Any) -> tuple[float, bool]:
    net: MeasuredNetwork = src.network
    msg = total_bytes / streams
    ia, ib = src.group.island, dst.group.island
    cross = links_of(net, "cross_type", (src.gpu.name, dst.gpu.name), ia) if src.gpu.name != dst.gpu.name else ()
    used = bool(cross)
    if cross:
        k = max(1, min(streams, src.gpus_per_node, dst.gpus_per_node))
        per_gpu = per_gpu_link(cross, k, msg, src.nic_gpu)
        rate, lat = per_gpu.bytes_per_s, per_gpu.latency_s
    else:
        ends = []
        for hw in (src, dst):
            links = links_of(net, "inter_node", (hw.gpu.name,), hw.group.island)
            used |= bool(links)
            ends.append(per_gpu_link(links, max(1, min(streams, hw.gpus_per_node)), msg, hw.nic_gpu))
        rate, lat = min(lk.bytes_per_s for lk in ends), max(lk.latency_s for lk in ends)
    rate *= streams
    if ia != ib:
        measured = aggregate_gbps(island_links_of(net, ia, ib), streams, msg)
        if measured is not None:
            used = True
            rate, lat = min(rate, measured[0] * 1e9), lat + measured[1]
        elif island_link is not None:
            rate = min(rate, island_link.bandwidth_gbps * 1e9 * min(src.params.nic_eff, dst.params.nic_eff))
            lat += island_link.latency_us * 1e-6
    return total_bytes / rate + lat, used
