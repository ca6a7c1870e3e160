"""The cluster: GPU types, node groups, islands and the links between them.

Units and conventions: see ``haap_milp.specs`` (the package docstring)."""

from __future__ import annotations

from pydantic import Field, computed_field, model_serializer, model_validator

from haap_milp.network.spec import MIN_LINK_GBPS, MeasuredNetwork
from haap_milp.specs.base import (
    Frozen,
    Name,
    NicType,
    Precision,
)

# Bounds on the cluster's shape: published heterogeneous clusters have a handful of islands and node groups
# (one per GPU type and fabric). Every pair of islands needs a link, so n islands mean n(n-1)/2 links to read,
# check and price; 64 islands are 2016 links. Beyond these a cluster is a typo or a generated hostile input.
MAX_ISLANDS = 64
MAX_NODE_GROUPS = 1024
# A node group's size: 100 000 nodes is ~10x the nodes of the largest published clusters; 64 GPUs per node is past
# any server sold (8 is usual; an NVL72 rack is 18 trays of 4)
MAX_NODES_PER_GROUP = 100_000
MAX_GPUS_PER_NODE = 64
# Bounds on a GPU's rates, far outside any real part, so that a typo cannot reach the estimator as 1e300 (its times
# underflowed to 0: a log of 0 in the calibration, a division by 0 in the compute bound; fuzz report #2) or as 1e-300.
# TFLOP/s: 1e6 is 1 EFLOP/s, ~200x a B200's dense FP8 (4.5 PFLOP/s); 1e-3 is 1 GFLOP/s, less than one CPU core.
MIN_TFLOPS, MAX_TFLOPS = 1e-3, 1e6
# GB/s of HBM and of the intra-node links: 1e6 is 1 PB/s, ~100x a B200's 8 TB/s HBM and 1000x NVLink 5's 900 GB/s
# per direction (the least: network.spec.MIN_LINK_GBPS, the slowest link).
MAX_DEVICE_GBPS = 1e6


def _tflops(what: str):
    return Field(default=None, description=f"{what}, TFLOP/s (None: unsupported).", ge=MIN_TFLOPS, le=MAX_TFLOPS)


class GPUSpec(Frozen):
    """One accelerator type. Values from vendor datasheets (see catalog/gpus.yaml sources)."""

    name: Name = Field(description="Canonical catalog name, e.g. 'a100-80g'.", min_length=1, max_length=100)
    vendor: str = Field(default="NVIDIA", description="Vendor name.")
    memory_gib: float = Field(description="Device memory in GiB.", gt=0, le=4096)
    bf16_tflops: float | None = _tflops("Dense BF16 peak")
    fp16_tflops: float | None = _tflops("Dense FP16 peak")
    fp8_tflops: float | None = _tflops("Dense FP8 peak")
    fp32_tflops: float | None = Field(
        default=None, description="FP32 peak without tensor cores (CUDA cores), TFLOP/s (None: not stated).",
        ge=MIN_TFLOPS, le=MAX_TFLOPS)
    tf32_tflops: float | None = _tflops("Dense TF32 tensor-core peak")
    hbm_bandwidth_gbps: float = Field(description="HBM bandwidth, GB/s.", ge=MIN_LINK_GBPS, le=MAX_DEVICE_GBPS)
    intra_node_bandwidth_gbps: float = Field(
        description="Intra-node link bandwidth per GPU per direction, GB/s (NVLink/PCIe).", ge=MIN_LINK_GBPS,
        le=MAX_DEVICE_GBPS)
    source: str = Field(default="", description="Where the numbers were read.")

    def peak_tflops(self, precision: Precision) -> float | None:
        """Dense peak for ``precision``; None where the GPU lacks it."""
        return {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "fp8": self.fp8_tflops,
                "fp32": self.fp32_tflops, "tf32": self.tf32_tflops}[precision]

    @model_serializer(mode="wrap")
    def _omit_unknown_fp32(self, handler):  # GPUs without fp32/tf32 figures serialise as before
        data = handler(self)
        if isinstance(data, dict):
            for k in ("fp32_tflops", "tf32_tflops"):
                if data.get(k, 0) is None:
                    data.pop(k)
        return data


class NodeGroup(Frozen):
    """A set of identical nodes sharing a GPU type, NIC and island."""

    gpu: GPUSpec = Field(description="GPU type of every GPU in these nodes.")
    num_nodes: int = Field(description="Number of nodes.", ge=1, le=MAX_NODES_PER_GROUP)
    gpus_per_node: int = Field(default=8, description="GPUs per node.", ge=1, le=MAX_GPUS_PER_NODE)
    nic: NicType = Field(default="ib", description="Inter-node network: ib, roce or ethernet.")
    nic_bandwidth_gbps: float = Field(
        description="Inter-node bandwidth per node (all NICs together, one direction), GB/s.", ge=MIN_LINK_GBPS,
        le=100_000
    )
    nic_latency_us: float = Field(default=5.0, description="Inter-node one-way latency, microseconds.", ge=0, le=1e6)
    island: Name = Field(
        default="main", description="Network island: nodes of one island share a fabric.", min_length=1, max_length=100
    )

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


class IslandLink(Frozen):
    """The link joining two islands (both directions)."""

    a: str = Field(description="One island.")
    b: str = Field(description="The other island.")
    bandwidth_gbps: float = Field(description="Aggregate bandwidth between the islands, GB/s.", ge=MIN_LINK_GBPS,
                                  le=100_000)
    latency_us: float = Field(default=50.0, description="One-way latency, microseconds.", ge=0, le=1e7)


class ClusterSpec(Frozen):
    """Node groups, possibly of several GPU types and islands, and the links between islands."""

    name: Name = Field(description="Display name.", min_length=1, max_length=200)
    node_groups: tuple[NodeGroup, ...] = Field(
        description=f"Node groups (at least one, at most {MAX_NODE_GROUPS}).", min_length=1, max_length=MAX_NODE_GROUPS)
    island_links: tuple[IslandLink, ...] = Field(default=(), description="Links between islands.")
    network: MeasuredNetwork | None = Field(
        default=None, description="Measured links (haap_milp/network); None: datasheet bandwidths x efficiencies.")

    @model_serializer(mode="wrap")
    def _omit_no_network(self, handler):  # output without a measured network stays as it was
        data = handler(self)
        if self.network is None and isinstance(data, dict):
            data.pop("network", None)
        return data

    @model_validator(mode="after")
    def _check_islands(self) -> ClusterSpec:
        islands = self.islands
        if len(islands) > MAX_ISLANDS:
            raise ValueError(f"{len(islands)} islands is more than the {MAX_ISLANDS} this planner accepts (every pair "
                             "of islands needs a link); put nodes that share a fabric in one island")
        for link in self.island_links:
            for end in (link.a, link.b):
                if end not in islands:
                    raise ValueError(f"island link names island {end!r}, which has no nodes (islands: {islands})")
            if link.a == link.b:
                raise ValueError(f"island link joins island {link.a!r} to itself")
        linked: dict[frozenset, int] = {}  # one set, not a scan per pair
        for i, lk in enumerate(self.island_links):
            j = linked.setdefault(frozenset((lk.a, lk.b)), i)
            if j != i:  # (only the first would be used: the second's numbers were silently ignored)
                raise ValueError(f"islands {lk.a!r} and {lk.b!r} are linked twice (island_links {j} and {i}, "
                                 f"{self.island_links[j].bandwidth_gbps:g} and {lk.bandwidth_gbps:g} GB/s); keep one")
        for i, a in enumerate(islands):
            for b in islands[i + 1 :]:
                if frozenset((a, b)) not in linked:
                    raise ValueError(f"islands {a!r} and {b!r} have no link between them; add one to island_links")
        return self

    @property
    def islands(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(g.island for g in self.node_groups))

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(g.gpu.name for g in self.node_groups))

    def gpu(self, name: str) -> GPUSpec:
        return next(g.gpu for g in self.node_groups if g.gpu.name == name)

    def island_link(self, a: str, b: str) -> IslandLink | None:
        return next((lk for lk in self.island_links if {lk.a, lk.b} == {a, b}), None)

    @computed_field(description="Total GPUs.")  # type: ignore[prop-decorator]
    @property
    def total_gpus(self) -> int:
        return sum(g.num_gpus for g in self.node_groups)

    @computed_field(description="GPUs per GPU type.")  # type: ignore[prop-decorator]
    @property
    def gpus_per_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.node_groups:
            out[g.gpu.name] = out.get(g.gpu.name, 0) + g.num_gpus
        return out

    @computed_field(description="GPUs per island.")  # type: ignore[prop-decorator]
    @property
    def gpus_per_island(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.node_groups:
            out[g.island] = out.get(g.island, 0) + g.num_gpus
        return out
