"""Rank order: which GPU of which node runs each world rank, so every stage lands on its GPU type.

Megatron-LM (``RankGenerator`` order ``tp-cp-ep-dp-pp``, tp fastest), FlagScale (meshes in order,
each mesh contiguous, same order inside) and torchtitan (device mesh ``pp, dp, cp, tp``, pp
outermost) all give pipeline stage j the contiguous block of world ranks
``[sum_{i<j} G_i, sum_{i<=j} G_i)`` with ``G_i = tp_i * cp * dp_i``, tensor-parallel peers adjacent.
torchrun numbers ranks node by node in node-rank order (``--node-rank``, local ranks 0..n-1),
so the placement is a list of nodes in node-rank order, each with the GPUs it runs
(``CUDA_VISIBLE_DEVICES``) and how many (``--nproc-per-node``). Node names are placeholders
(``<island>-<gpu>-g<group>-n<k>``) to replace with real host names, keeping the order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import yaml

from haap_milp.specs import ClusterSpec, Plan
from haap_milp.targets import EmitError


@dataclass(frozen=True)
class NodeUse:
    """One node of the launch, in node-rank order."""

    name: str
    gpu_type: str
    island: str
    nic: str
    devices: tuple[int, ...]  # local GPU indices, in local-rank order
    first_rank: int

    @property
    def nproc(self) -> int:
        return len(self.devices)


@dataclass(frozen=True)
class Placement:
    nodes: tuple[NodeUse, ...]
    stage_first_rank: tuple[int, ...]
    stage_num_ranks: tuple[int, ...]

    @property
    def world_size(self) -> int:
        return sum(n.nproc for n in self.nodes)

    def rank_location(self, rank: int) -> tuple[str, int]:
        for n in self.nodes:
            if n.first_rank <= rank < n.first_rank + n.nproc:
                return n.name, n.devices[rank - n.first_rank]
        raise IndexError(rank)

    def stage_of_rank(self, rank: int) -> int:
        for j, (lo, k) in enumerate(zip(self.stage_first_rank, self.stage_num_ranks)):
            if lo <= rank < lo + k:
                return j
        raise IndexError(rank)

    def hostfile(self, types: dict[str, str] | None = None) -> str:
        """``host slots=N [type=LABEL]`` per node, node-rank order (OpenMPI/DeepSpeed; FlagScale adds the
        device label of each node, ``types``: node name -> label)."""
        lines = ["# haap rank order: replace the placeholder names with real hosts, keep the order"]
        for n in self.nodes:
            lines.append(f"{n.name} slots={n.nproc}" + (f" type={types[n.name]}" if types else ""))
        return "\n".join(lines) + "\n"

    def rank_map_json(self) -> str:
        doc = {
            "world_size": self.world_size,
            "nodes": [{"node_rank": i, "name": n.name, "gpu_type": n.gpu_type, "island": n.island, "nic": n.nic,
                       "nproc_per_node": n.nproc, "cuda_visible_devices": ",".join(map(str, n.devices)),
                       "first_rank": n.first_rank} for i, n in enumerate(self.nodes)],
            "stages": [{"stage": j, "first_rank": lo, "num_ranks": k}
                       for j, (lo, k) in enumerate(zip(self.stage_first_rank, self.stage_num_ranks))],
        }
        return json.dumps(doc, indent=2) + "\n"


class _Cursor:
    """Walks the nodes of the groups matching one (gpu type, island)."""

    def __init__(self, groups: list[tuple[int, object]]):
        self.slots = [(gi, k, g) for gi, g in groups for k in range(g.num_nodes)]
        self.i = 0
        self.used = 0  # GPUs taken on slots[i]
        self.last_rank = -2  # last world rank placed on slots[i]

    def take(self, rank: int, tp: int) -> tuple[tuple[int, int, object], int]:
        """Place ranks rank..rank+tp-1 (one tensor-parallel group) on one node; returns (slot, first GPU)."""
        while self.i < len(self.slots):
            gpn = self.slots[self.i][2].gpus_per_node
            contiguous = self.used == 0 or self.last_rank == rank - 1
            if tp <= gpn - self.used and contiguous:
                first = self.used
                self.used += tp
                self.last_rank = rank + tp - 1
                return self.slots[self.i], first
            self.i, self.used, self.last_rank = self.i + 1, 0, -2
        raise EmitError("out of nodes")


def _host_word(kind: str, text: str) -> str:
    """An island or GPU name as part of a node name: launch.sh matches node names as ``case`` patterns and the
    hostfile splits lines at spaces, so a name with shell syntax ('a) rm -rf ~ ;; x') or a space would run as
    code or break the file."""
    if not all(c.isalnum() or c in "._+-" for c in text):
        raise EmitError(f"{kind} {text!r} cannot be part of a node name: emit writes '<island>-<gpu>-g<group>-n<k>' "
                        f"into hostfile and launch.sh as one shell word; use letters, digits, '.', '_', '+' and '-' "
                        f"in island and GPU names")
    return text


def place(plan: Plan, cluster: ClusterSpec) -> Placement:
    """Assign every rank to (node, GPU); raises EmitError when the stages do not fit the nodes."""
    cursors: dict[tuple[str, str], _Cursor] = {}
    per_slot: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (group, node) -> [(rank, gpu)]
    slot_info: dict[tuple[int, int], object] = {}
    firsts, counts, rank = [], [], 0
    for j, st in enumerate(plan.stages):
        key = (st.gpu_type, st.island)
        if key not in cursors:
            groups = [(gi, g) for gi, g in enumerate(cluster.node_groups)
                      if g.gpu.name == st.gpu_type and g.island == st.island]
            if not groups:
                raise EmitError(f"stage {j} wants {st.gpu_type} GPUs on island {st.island!r}; the cluster "
                                f"{cluster.name!r} has none there")
            cursors[key] = _Cursor(groups)
        need = st.tp * st.dp * plan.cp
        firsts.append(rank)
        counts.append(need)
        for r in range(rank, rank + need, st.tp):
            try:
                (gi, k, g), gpu = cursors[key].take(r, st.tp)
            except EmitError:
                raise EmitError(f"stage {j} needs {need} {st.gpu_type} GPUs on island {st.island!r} in groups of "
                                f"tp={st.tp} inside a node, after the stages before it; the nodes there run out "
                                f"(rank {r})") from None
            per_slot.setdefault((gi, k), []).extend((r + i, gpu + i) for i in range(st.tp))
            slot_info[(gi, k)] = g
        rank += need
    nodes = []
    for (gi, k), ranks in sorted(per_slot.items(), key=lambda kv: kv[1][0][0]):
        g = slot_info[(gi, k)]
        name = f"{_host_word('island', g.island)}-{_host_word('GPU type', g.gpu.name)}-g{gi}-n{k}"
        nodes.append(NodeUse(name, g.gpu.name, g.island, g.nic,
                             tuple(gpu for _, gpu in ranks), ranks[0][0]))
    return Placement(tuple(nodes), tuple(firsts), tuple(counts))


class _FlowListDumper(yaml.SafeDumper):
    """Block-style mappings, flow-style lists of scalars (readable configs)."""


def _repr_list(dumper, data):
    flow = all(not isinstance(x, (list, dict)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_FlowListDumper.add_representer(list, _repr_list)


def dump_yaml(doc: dict) -> str:
    return yaml.dump(doc, Dumper=_FlowListDumper, sort_keys=False, default_flow_style=False, width=120)
