"""Collective communication on the links actually used (ring / hierarchical algorithms).

Bandwidths are achievable bus bandwidths: datasheet per-direction GB/s x a calibrated efficiency, or,
when the cluster carries a measured network, the measured figure at the caller's real message size and
sender count, as given (haap_milp/network/pricing.py builds those Links; hardware.Hardware hands them out).
Each cost is split into a part linear in the message (seconds per byte) and a latency part, so that
callers can keep per-layer costs additive (problem.py eq. T1) and charge latencies once per stage.
Formulas: Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in
MPICH" (2005) - ring all-reduce 2(n-1)/n·M/B + 2(n-1)·a, reduce-scatter / all-gather (n-1)/n·M/B +
(n-1)·a; NCCL's hierarchical (intra-node then inter-node) variants for groups that span nodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

# collective kinds: bandwidth factor f in f·(n-1)/n·M/B
FACTOR = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0}


@dataclass(frozen=True)
class Link:
    """An achievable link: bytes/s in one direction and a per-message latency."""

    bytes_per_s: float
    latency_s: float


@dataclass(frozen=True)
class Cost:
    """``per_byte_s · message_bytes + latency_s``."""

    per_byte_s: float
    latency_s: float

    def time(self, message_bytes: float) -> float:
        return self.per_byte_s * message_bytes + (self.latency_s if message_bytes > 0 else 0.0)

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.per_byte_s + other.per_byte_s, self.latency_s + other.latency_s)


ZERO = Cost(0.0, 0.0)


def ring(kind: str, n: int, link: Link) -> Cost:
    """Ring collective over n ranks on one kind of link (n = 1: free)."""
    if n <= 1:
        return ZERO
    f = FACTOR[kind]
    return Cost(f * (n - 1) / n / link.bytes_per_s, f * (n - 1) * link.latency_s)


def group_collective(kind: str, n: int, span: int, gpus_per_node: int, nvlink: Link, nic_node: Link) -> Cost:
    """Collective over n ranks spaced ``span`` GPUs apart (span = tp for a DP group: Megatron rank order).

    Fits in a node (n·span <= gpus_per_node): ring on NVLink. Otherwise hierarchical: r = gpus_per_node
    / span ranks per node reduce on NVLink, then each GPU's 1/r shard crosses nodes; the node's NICs
    (``nic_node``: all NICs of the node together) are shared by all its GPUs, which run their groups'
    collectives at the same time, so the node carries gpus_per_node · f·(N-1)/N · M/r bytes.
    """
    if n <= 1:
        return ZERO
    if n * span <= gpus_per_node:
        return ring(kind, n, nvlink)
    r = max(1, gpus_per_node // max(span, 1))
    r = min(r, n)
    nodes = math.ceil(n / r)
    f = FACTOR[kind]
    intra = ring(kind, r, nvlink)
    inter_per_byte = gpus_per_node * f * (nodes - 1) / nodes / r / nic_node.bytes_per_s
    return intra + Cost(inter_per_byte, f * (nodes - 1) * nic_node.latency_s)


def all_to_all(n: int, span: int, gpus_per_node: int, nvlink: Link, nic_per_gpu: Link) -> Cost:
    """All-to-all of M bytes per rank over n ranks spaced ``span`` apart: (n-1)/n of M leaves the rank;
    peers in the same node go over NVLink, the others over this GPU's share of the node's NICs; the
    two run concurrently (NCCL send/recv on separate channels), so the slower one counts."""
    if n <= 1:
        return ZERO
    local = max(1, min(n, gpus_per_node // max(span, 1)))
    remote_frac, local_frac = (n - local) / n, (local - 1) / n
    per_byte = max(local_frac / nvlink.bytes_per_s, remote_frac / nic_per_gpu.bytes_per_s if remote_frac else 0.0)
    lat = nic_per_gpu.latency_s if remote_frac else nvlink.latency_s  # sends are issued concurrently
    return Cost(per_byte, lat)


def p2p(link: Link) -> Cost:
    """One point-to-point transfer."""
    return Cost(1.0 / link.bytes_per_s, link.latency_s)


def ring_attention_exposed(cp: int, step_s: float, compute_s: float) -> float:
    """Exposed seconds of context-parallel ring attention (eq. CP2; Megatron-Core / Transformer Engine
    ``AttnFuncWithCPAndKVP2P``): the core attention runs in cp steps, one per K/V block, each block's compute
    ``compute_s / cp`` (load-balanced causal chunks) overlapping the send of the next block (``step_s``); the
    cp - 1 sends show only where a send outlasts the block's compute."""
    if cp <= 1:
        return 0.0
    return (cp - 1) * max(0.0, step_s - compute_s / cp)


def overlap_contention_s(comm_s: float, compute_s: float, kappa: float) -> float:
    """Eq. Z4b: extra seconds when a collective of ``comm_s`` overlaps ``compute_s`` of compute: NCCL's kernels
    occupy SMs and HBM bandwidth the GEMMs would use, so the overlapped span runs ``kappa`` (fitted,
    ``GlobalParams.overlap_slowdown``) slower: kappa·min(comm, compute). The rest of the overlap rule (what is
    hidden, what shows) is the caller's."""
    return kappa * min(comm_s, compute_s)


def ring_measured(kind: str, n: int, link_at: Callable[[float], Link], lo_bytes: float, hi_bytes: float) -> Cost:
    """Flat ring of n ranks whose link depends on the message size (a measured curve): each of the f·(n-1)
    steps sends one chunk of M/n bytes, so T(M) = f·(n-1)·(M/n / bw(M/n) + latency) (Thakur et al. 2005; Sailor's
    ``estimate_ar_time`` is the same sum). T is not linear in M where bw grows with the chunk, so the returned
    ``Cost`` is the secant through M = ``lo_bytes`` and M = ``hi_bytes`` (callers: one decoder layer's gradient
    and one bucket): exact at both, the slope of a full bucket beyond it, and its intercept (>= 0 while bw grows
    with the size) is the per-collective start-up the caller charges once per stage."""
    if n <= 1:
        return ZERO
    f = FACTOR[kind]

    def total(m: float) -> float:
        link = link_at(m / n)
        return f * (n - 1) * (m / n / link.bytes_per_s + link.latency_s)

    hi = max(hi_bytes, 1.0)
    lo = min(max(lo_bytes, 1.0), hi)
    t_lo, t_hi = total(lo), total(hi)
    if hi - lo < 1e-9 * hi:  # one point: a line through the origin's start-up
        link = link_at(hi / n)
        return Cost(f * (n - 1) / n / link.bytes_per_s, f * (n - 1) * link.latency_s)
    slope = (t_hi - t_lo) / (hi - lo)
    return Cost(slope, max(0.0, t_lo - slope * lo))


# ---------------------------------------------------------------- MoE token dispatch (expert parallelism)


def expected_nodes_hit(experts: int, nodes: int, top_k: int) -> float:
    """Expected number of distinct nodes holding a token's top_k experts when the E experts are spread evenly
    over ``nodes`` nodes and routing is balanced (uniform over k-subsets):
    N·(1 - C(E - E/N, k) / C(E, k))."""
    if nodes <= 1:
        return 1.0
    per_node = experts / nodes
    miss = math.comb(round(experts - per_node), top_k) / math.comb(experts, top_k) if top_k <= experts else 0.0
    return nodes * (1.0 - miss)


def node_dedup_all_to_all(n: int, span: int, gpus_per_node: int, nvlink: Link, nic_per_gpu: Link, experts: int,
                          top_k: int) -> Cost:
    """Dispatch (or combine) of M bytes per rank = its top_k copies of each token, DeepEP-style (Megatron-Core
    ``--moe-token-dispatcher-type flex``; DeepSeek-V3 technical report sec. 3.2.2): a token crosses the network
    once per distinct remote node holding one of its experts (to the same-index GPU there, which forwards it
    over NVLink), not once per expert. NIC bytes: M·(nodes hit remotely)/k; NVLink bytes: the copies for
    other GPUs of the node, (n_local - 1)/n of M, plus the forwarding of what arrives, as many again.
    Both run concurrently; the slower counts."""
    if n <= 1:
        return ZERO
    local = max(1, min(n, gpus_per_node // max(span, 1)))
    nodes = max(1, math.ceil(n / local))
    if nodes <= 1:
        return all_to_all(n, span, gpus_per_node, nvlink, nic_per_gpu)
    hit = expected_nodes_hit(experts, nodes, top_k)
    remote = hit * (nodes - 1) / nodes / top_k  # share of M that crosses the NIC
    local_share = (local - 1) / n + remote  # intra-node copies + forwarding of what arrived
    per_byte = max(local_share / nvlink.bytes_per_s, remote / nic_per_gpu.bytes_per_s)
    return Cost(per_byte, nic_per_gpu.latency_s)


def all_gather_dispatch(n: int, span: int, gpus_per_node: int, nvlink: Link, nic_node: Link) -> Cost:
    """Megatron-Core ``allgather`` dispatcher: the hidden states are all-gathered over the tp x ep group and
    the expert outputs reduce-scattered back (the per-byte cost of one of them, M = this rank's tokens)."""
    return group_collective("all_gather", n, span, gpus_per_node, nvlink, nic_node)
