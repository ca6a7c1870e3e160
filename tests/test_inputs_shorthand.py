"""The cluster shorthand 'a100-80g:64,h100-80g:32/8@roce'."""

from __future__ import annotations

import pytest

from haap_milp.catalog import load_cluster
from haap_milp.catalog.shorthand import looks_like_shorthand
from haap_milp.errors import HaapInputError


def test_two_types_default_nodes() -> None:
    c = load_cluster("a100-80g:64,h100-80g:32")
    assert c.gpus_per_type == {"a100-80g": 64, "h100-80g": 32}
    assert c.gpus_per_island == {"main": 96}
    assert [(g.num_nodes, g.gpus_per_node, g.nic, g.nic_bandwidth_gbps) for g in c.node_groups] == [
        (8, 8, "ib", 200.0), (4, 8, "ib", 400.0)]
    assert c.island_links == ()


def test_island_named_like_a_nic_sets_the_nic_and_gets_a_default_link() -> None:
    c = load_cluster("a100-80g:64,v100-32g:32@roce")
    assert c.gpus_per_island == {"main": 64, "roce": 32}
    v100 = c.node_groups[1]
    assert (v100.nic, v100.nic_bandwidth_gbps, v100.island) == ("roce", 50.0, "roce")
    link = c.island_link("main", "roce")
    assert link is not None and (link.bandwidth_gbps, link.latency_us) == (12.5, 50)  # 100 Gb/s Ethernet


def test_gpus_per_node_scales_nic_and_islands_pairwise_linked() -> None:
    c = load_cluster(" a100-80g:16/4@east , h100-80g:16@west, l40s-48g:8@ethernet ")
    a100 = c.node_groups[0]
    assert (a100.num_nodes, a100.gpus_per_node, a100.nic_bandwidth_gbps) == (4, 4, 100.0)  # 200 GB/s x 4/8
    assert c.node_groups[2].nic == "ethernet"
    assert len(c.island_links) == 3  # every pair of the three islands
    assert c.total_gpus == 40


def test_mi250x_default_node_is_four_gpus() -> None:
    assert load_cluster("mi250x-128g:16").node_groups[0].num_nodes == 4


def test_same_island_twice_is_one_island() -> None:
    c = load_cluster("a100-80g:8@x,a100-40g:8@x")
    assert c.islands == ("x",) and c.island_links == ()


@pytest.mark.parametrize("text,needle", [
    ("a100-80g:60", "multiple of GPUs per node (56 or 64)"),
    ("a100-80g:0", "GPU count '0'"),
    ("a100-80g:-8", "GPU count '-8'"),
    ("a100-80g:8/0", "GPUs per node '0'"),
    ("a100-80g:8/x", "GPUs per node 'x'"),
    ("a100-80g:9999999999", "GPU count '9999999999'"),
    ("a100-80g:64/128", "GPUs per node '128'; at most 64 are accepted"),
    ("a100-80g:4", "multiple of GPUs per node (8)"),
    # fuzz #10: the node group's bounds said in the shorthand's terms, not by field paths the user never wrote
    ("a100-80g:130/65", "GPUs per node '65'; at most 64 are accepted"),
    ("a100-80g:1000000", "asks for 125000 nodes of 8 GPUs; one item holds at most 100000 nodes"),
    ("a100-80g:99999999999999999999", "GPU count '99999999999999999999'; at most 1048576 are accepted"),
    ("a100-80g:" + "9" * 5000, "at most 1048576 are accepted"),  # (no int() of 5000 digits: Python refuses it)
    ("v100:8", "did you mean 'v100-32g'"),
    ("a100-80g:8,,h100-80g:8", "empty item"),
    ("a100-80g:8@", "island ''"),
    ("a100-80g:8@two words", "island 'two words'"),
    ("a100-80g:8:8", "GPU count '8:8'"),
])
def test_bad_shorthand_is_one_paragraph_naming_the_value(text: str, needle: str) -> None:
    with pytest.raises(HaapInputError) as exc:
        load_cluster(text)
    assert needle in str(exc.value)
    assert "\n" not in str(exc.value) and "node_groups." not in str(exc.value)


def test_shorthand_detection() -> None:
    assert looks_like_shorthand("a100-80g:64")
    assert not looks_like_shorthand("./clusters/my.yaml")
    assert not looks_like_shorthand("dir/with:colon.yaml")
