"""Built-in GPUs and clusters: names, datasheet values, NIC defaults, preset coverage."""

from __future__ import annotations

import pytest

from haap_milp.catalog import DEFAULT_CLUSTER, cluster_names, gpu_names, load_cluster, load_gpu
from haap_milp.catalog.data import catalog
from haap_milp.errors import HaapInputError

CANONICAL_GPUS = ["v100-16g", "v100-32g", "a100-40g", "a100-80g", "a100-pcie-80g", "a800-80g", "h100-80g", "h100-pcie-80g", "h800-80g", "h20-96g", "h200-141g", "l40s-48g", "l4-24g", "a10-24g", "t4-16g", "mi250x-128g", "mi300x-192g", "ascend910b-64g"]


def test_gpu_names_are_exactly_the_canonical_list() -> None:
    assert gpu_names() == CANONICAL_GPUS


@pytest.mark.parametrize("name,memory,bf16,intra", [
    # NVIDIA A100 datasheet: 80 GB, 312 TF dense BF16, NVLink 600 GB/s bidirectional = 300 per direction.
    ("a100-80g", 80, 312, 300),
    # NVIDIA H100 SXM datasheet: 989.4 TF dense BF16 (1979 is with sparsity), NVLink 900 GB/s bidir.
    ("h100-80g", 80, 989.4, 450),
    # V100 and T4 have no BF16 tensor cores (datasheets); the Ascend 910B source states FP16 only.
    ("v100-32g", 32, None, 150),
    ("t4-16g", 16, None, 16),
    ("ascend910b-64g", 64, None, 196),
])
def test_datasheet_values(name: str, memory: float, bf16: float | None, intra: float) -> None:
    gpu = load_gpu(name)
    assert (gpu.memory_gib, gpu.bf16_tflops, gpu.intra_node_bandwidth_gbps) == (memory, bf16, intra)


def test_every_gpu_has_source_and_default_node() -> None:
    for name, entry in catalog().gpus.items():
        assert entry.spec.source, name
        node = entry.default_node
        assert node.nic in ("ib", "roce", "ethernet") and node.nic_bandwidth_gbps > 0 and node.rationale, name
        assert entry.spec.fp16_tflops is not None, name  # every accelerator here does fp16


def test_default_node_bandwidths_from_the_brief() -> None:
    # DGX A100 8 x 200 Gb/s HDR = 200 GB/s; DGX H100 8 x 400 Gb/s = 400 GB/s; DGX-1 4 x 100 Gb/s = 50 GB/s.
    gpus = catalog().gpus
    assert gpus["a100-80g"].default_node.nic_bandwidth_gbps == 200
    assert gpus["h100-80g"].default_node.nic_bandwidth_gbps == 400
    assert gpus["v100-32g"].default_node.nic_bandwidth_gbps == 50
    assert gpus["l40s-48g"].default_node.nic_bandwidth_gbps == 25


@pytest.mark.parametrize("alias", ["A100-80G", "a100_80g", "A100-SXM4-80GB", "a100 80gb"])
def test_gpu_lookup_is_case_insensitive_with_aliases(alias: str) -> None:
    assert load_gpu(alias).name == "a100-80g"


def test_gpu_typo_gets_did_you_mean() -> None:
    with pytest.raises(HaapInputError, match="did you mean 'h100-80g'"):
        load_gpu("h100-80")


def test_presets_cover_the_required_range() -> None:
    clusters = {n: load_cluster(n) for n in cluster_names()}
    assert len(clusters) >= 6
    assert {len(c.gpu_types) for c in clusters.values()} >= {1, 2, 3}
    assert min(c.total_gpus for c in clusters.values()) == 16
    assert max(c.total_gpus for c in clusters.values()) == 4096
    three = [c for c in clusters.values() if set(c.gpu_types) == {"h100-80g", "a100-80g", "a100-40g"}]
    assert {c.total_gpus for c in three} >= {1024, 4096}


def test_two_island_preset_uses_different_nics_and_a_25gbit_link() -> None:
    c = load_cluster("a100-v100-islands-96")
    assert len(c.islands) == 2
    assert {g.island: g.nic for g in c.node_groups} == {"ib-a100": "ib", "roce-v100": "roce"}
    link = c.island_link("ib-a100", "roce-v100")
    assert link is not None and link.bandwidth_gbps == 25 / 8  # 25 Gb/s Ethernet = 3.125 GB/s


@pytest.mark.parametrize("name", cluster_names())
def test_every_preset_totals_add_up(name: str) -> None:
    c = load_cluster(name)
    assert c.name == name
    assert sum(c.gpus_per_type.values()) == sum(c.gpus_per_island.values()) == c.total_gpus
    assert c.total_gpus == sum(g.num_nodes * g.gpus_per_node for g in c.node_groups)


def test_default_cluster_is_heterogeneous_and_all_bf16() -> None:
    c = load_cluster(DEFAULT_CLUSTER)
    assert len(c.gpu_types) == 2 and 32 <= c.total_gpus <= 64
    assert all(c.gpu(t).bf16_tflops for t in c.gpu_types)
    speeds = {c.gpu(t).bf16_tflops for t in c.gpu_types}
    assert max(speeds) / min(speeds) > 2  # heterogeneity a plan must exploit


def test_metis_preset_matches_its_clusterfile() -> None:
    # Sailor/Metis clusterfile.json: A100 nodes 2.3 GB/s, V100 nodes 1.6 GB/s inter-node, 4 GPUs per node.
    c = load_cluster("metis-a100-v100-16")
    assert [(g.gpu.name, g.gpus_per_node, g.nic_bandwidth_gbps) for g in c.node_groups] == [
        ("a100-40g", 4, 2.3), ("v100-16g", 4, 1.6)]


def test_unknown_cluster_name_hints() -> None:
    with pytest.raises(HaapInputError, match="did you mean 'a100-16'"):
        load_cluster("a100-61")
    with pytest.raises(HaapInputError, match="'a100-80g:8'"):
        load_cluster("a100-80g")  # a GPU name, not a cluster: suggests the shorthand
