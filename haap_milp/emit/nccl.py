"""NCCL environment per node for clusters with mixed NICs (InfiniBand, RoCE, plain Ethernet).

Following Holmes (Yang et al., ICPP 2024, arXiv:2312.03549): every GPU group uses the fastest
transport its NIC supports for its own collectives (IB verbs on InfiniBand and RoCE, TCP sockets on
Ethernet), and traffic between groups of different NIC types goes over what both ends have.
Variables (NCCL user guide, "Environment Variables"): ``NCCL_IB_DISABLE`` (1 = no IB verbs),
``NCCL_NET`` (``IB`` or ``Socket``), ``NCCL_IB_HCA`` (which HCAs, e.g. ``mlx5``),
``NCCL_IB_GID_INDEX`` (RoCE v2 usually sits at GID index 3), ``NCCL_SOCKET_IFNAME`` (the interface
for sockets and bootstrap). Stock NCCL picks one network per process, so a node whose pipeline
neighbour sits on a different transport (IB/RoCE next to Ethernet) must use sockets for all its
traffic; the script says so for each such node. Interface and HCA names are hints to adjust.
"""

from __future__ import annotations

from haap_milp.emit.placement import Placement, place
from haap_milp.specs import ClusterSpec, Plan

TRANSPORT = {"ib": "IB", "roce": "IB", "ethernet": "Socket"}


def env_for(nic: str, transport: str) -> dict[str, str]:
    """NCCL variables for one node with NIC ``nic`` that must speak ``transport``."""
    if transport == "Socket":
        return {"NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "eth0"}
    env = {"NCCL_IB_DISABLE": "0", "NCCL_NET": "IB", "NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "^lo,docker"}
    if nic == "roce":
        env["NCCL_IB_GID_INDEX"] = "3"
    return env


def rdma_between(a, b) -> bool:
    """Can IB verbs reach from node a to node b? Same island and both RDMA NICs (IB/RoCE); across
    islands only RoCE to RoCE (RoCE v2 is routed over IP; IB subnets and IB-RoCE need gateways)."""
    if "ethernet" in (a.nic, b.nic):
        return False
    if a.island == b.island:
        return True
    return a.nic == b.nic == "roce"


def node_transports(plan: Plan, placement: Placement) -> dict[str, tuple[str, str]]:
    """Node name -> (transport, reason). Socket where a pipeline neighbour cannot be reached by IB verbs."""
    hosts = {j: [n for n in placement.nodes if _hosts(n, placement, j)] for j in range(plan.pp)}
    out = {}
    for n in placement.nodes:
        if TRANSPORT[n.nic] == "Socket":
            out[n.name] = ("Socket", "Ethernet NIC")
            continue
        stages = [j for j in range(plan.pp) if n in hosts[j]]
        far = sorted({m.name for j in stages for k in (j - 1, j + 1) if 0 <= k < plan.pp
                      for m in hosts[k] if not rdma_between(n, m)})
        if far:
            why = (f"pipeline neighbour {far[0]} is not reachable by IB verbs; stock NCCL uses one network per "
                   f"process, so this node's data-parallel traffic uses TCP too")
            out[n.name] = ("Socket", why)
        else:
            out[n.name] = ("IB", f"own NIC ({n.nic})")
    return _close_over_stages(out, hosts)


def _close_over_stages(out: dict, hosts: dict) -> dict:
    """A stage's tp/dp communicators need one transport: if one of its nodes uses sockets, all do."""
    changed = True
    while changed:
        changed = False
        for j, nodes in hosts.items():
            if any(out[n.name][0] == "Socket" for n in nodes):
                for n in nodes:
                    if out[n.name][0] != "Socket":
                        out[n.name] = ("Socket", f"shares stage {j}'s communicators with a node on sockets")
                        changed = True
    return out


def _hosts(node, placement: Placement, stage: int) -> bool:
    lo, k = placement.stage_first_rank[stage], placement.stage_num_ranks[stage]
    return node.first_rank < lo + k and lo < node.first_rank + node.nproc


def emit_nccl_env(plan: Plan, cluster: ClusterSpec) -> dict[str, str]:
    """``nccl_env.sh`` (sourced by launch.sh) when the cluster mixes NIC types or islands; nothing otherwise."""
    if len({g.nic for g in cluster.node_groups}) < 2 and len(cluster.islands) < 2:
        return {}
    placement = place(plan, cluster)
    lines = ["# NCCL settings per node (haap; Holmes-style per-NIC transports). Source with HAAP_NODE set.",
             "# Interface/HCA names are hints: check `ibv_devices` and `ip link` on your nodes.",
             'case "${HAAP_NODE:?}" in']
    for n, (transport, why) in node_transports(plan, placement).items():
        node = next(x for x in placement.nodes if x.name == n)
        env = env_for(node.nic, transport)
        lines.append(f"  # {n}: {node.gpu_type} on island {node.island}, NIC {node.nic} -> {transport} ({why})")
        lines.append(f"  {n}) export " + " ".join(f"{k}={v}" for k, v in env.items()) + " ;;")
    lines.append("esac")
    return {"nccl_env.sh": "\n".join(lines) + "\n"}
