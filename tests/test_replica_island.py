"""``Estimator.replica_island``: islands whose nodes price one replica alike share eq. H7's split prices.

The sharing is exact only if a single replica's layer price (dp = cp = ep = etp = 1) reads nothing the islands
differ in; these tests check that claim on the prices themselves, that islands whose nodes differ inside (GPUs a
node, measured intra-node links) or MoE models are kept apart, and that presolve builds the same problem with and
without the sharing."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from haap_milp import mixed_stages, presolve
from haap_milp.catalog import load_cluster, load_model
from haap_milp.errors import HaapInputError
from haap_milp.estimator import Estimator
from haap_milp.network.spec import MeasuredLink, MeasuredNetwork
from haap_milp.specs import SolveOptions, TrainingSpec

TWO_NICS = "h100-80g:16@ib,h100-80g:16@roce,a100-40g:16@ib,a100-40g:16@roce"


def _slow_roce(cluster: str):
    """The cluster with its roce nodes' NICs at half the bandwidth and twice the latency (the catalog's ib and roce
    nodes have the same NIC figures)."""
    c = load_cluster(cluster)
    groups = tuple(g.model_copy(update={"nic_bandwidth_gbps": g.nic_bandwidth_gbps / 2, "nic_latency_us": 10.0})
                   if g.island == "roce" else g for g in c.node_groups)
    return c.model_copy(update={"node_groups": groups})


def _est(model: str, cluster, precision: str = "bf16") -> Estimator:
    cluster = load_cluster(cluster) if isinstance(cluster, str) else cluster
    return Estimator(load_model(model), cluster, TrainingSpec(global_batch_size=64, seq_len=2048, precision=precision))


def _one_replica(est: Estimator, gpu: str, island: str, tp: int, rc: str, m: int):
    try:
        return est.layer_cost(gpu, tp, 1, 1, 1, rc, m, island=island)
    except HaapInputError:
        return None


@pytest.mark.parametrize(("model", "precision"), [("llama3-8b", "bf16"), ("gpt3-1.3b", "fp16"), ("opt-350m", "fp32")])
def test_islands_apart_only_in_their_nics_price_one_replica_alike(model, precision):
    est = _est(model, _slow_roce(TWO_NICS), precision)
    for gpu in ("h100-80g", "a100-40g"):
        assert est.replica_island(gpu, "ib") == "ib" and est.replica_island(gpu, "roce") == "ib"
        assert est.hardware(gpu, "ib").nic_node != est.hardware(gpu, "roce").nic_node  # (the islands do differ)
        for tp, rc, m in itertools.product((1, 2, 4, 8), ("none", "selective", "full"), (1, 2, 3, 8)):
            assert _one_replica(est, gpu, "ib", tp, rc, m) == _one_replica(est, gpu, "roce", tp, rc, m)


def test_moe_models_and_islands_whose_nodes_differ_are_kept_apart():
    assert _est("mixtral-8x7b", TWO_NICS).replica_island("h100-80g", "roce") == "roce"
    est = _est("llama3-8b", "h100-80g:16/8@ib,h100-80g:16/4@roce")  # 8 against 4 GPUs a node
    assert est.replica_island("h100-80g", "roce") == "roce"
    curve = {"kind": "table", "points": [{"message_bytes": 1e6, "bandwidth_gbps": 100.0}]}
    only_roce = MeasuredLink(link="intra_node", gpu_types=("h100-80g",), islands=("roce",), per="gpu_stream",
                             op="all_reduce", curve=curve)
    cluster = _slow_roce(TWO_NICS).model_copy(update={"network": MeasuredNetwork(links=(only_roce,))})
    est = _est("llama3-8b", cluster)
    assert est.replica_island("h100-80g", "roce") == "roce"  # its measured NVLink is its own
    assert est.replica_island("a100-40g", "roce") == "ib"  # (no figure for this type: both read the datasheet)
    assert _one_replica(est, "h100-80g", "ib", 8, "none", 4) != _one_replica(est, "h100-80g", "roce", 8, "none", 4)


def test_pair_batches_bundle_twin_pairs_and_keep_unlike_islands_apart():
    groups = presolve.cluster_groups(_slow_roce(TWO_NICS))
    pairs = mixed_stages.island_pairs(groups)
    assert len(pairs) == 2
    assert len(mixed_stages.pair_batches(groups, pairs)) == 2  # by island: no price is shared
    est = _est("llama3-8b", _slow_roce(TWO_NICS))
    shared = mixed_stages.pair_batches(groups, pairs, lambda g: (groups[g].gpu_type,
                                                                 est.replica_island(groups[g].gpu_type, groups[g].island)))
    assert shared == [tuple(pairs)]  # the pair and its twin on the other island: one share


def _problem(share: bool, monkeypatch):
    if not share:
        monkeypatch.setattr(Estimator, "replica_island", lambda self, gpu, island: island)
    model, cluster = load_model("llama3-8b"), _slow_roce(TWO_NICS)
    training = TrainingSpec(global_batch_size=256, seq_len=2048)
    opts = SolveOptions(time_limit_s=30, threads=1, mixed_stages="on")
    return presolve.build(model, cluster, training, opts, Estimator(model, cluster, training)).problem


def test_presolve_builds_the_same_problem_with_and_without_the_sharing(monkeypatch):
    p = _problem(True, monkeypatch)
    q = _problem(False, monkeypatch)
    assert sum(1 for o in p.options if o.mix) > 0
    assert p.options == q.options and len(p.variants) == len(q.variants)
    for u, v in zip(p.variants, q.variants):
        for f in dataclasses.fields(u):
            a, b = getattr(u, f.name), getattr(v, f.name)
            assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, f.name
