"""benchmarks/sailor_sim.py (a re-implementation of Sailor's runtime simulator) reproduces the throughputs
Sailor's simulator gives the published Fig. 8b plans (OPT-350M, A100-40 + V100-16, fp32)."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("sailor_sim", ROOT / "benchmarks" / "sailor_sim.py")
ss = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("sailor_sim", ss)  # dataclasses look their module up
_spec.loader.exec_module(ss)

SAILOR_7 = [(0, 2, "v100-16g", 4), (2, 3, "a100-40g", 1), (5, 4, "a100-40g", 1), (9, 4, "a100-40g", 1),
            (13, 4, "a100-40g", 1), (17, 4, "v100-16g", 4), (21, 3, "v100-16g", 4)]


def _plan(stages, mbs):
    return {"micro_batch_size": mbs, "stages": [{"first_layer": f, "num_layers": n, "gpu_type": g, "tp": tp, "dp": d}
                                                for f, n, g, tp, d in stages]}


MIXED_32 = {"micro_batch_size": 2, "stages": [
    {"first_layer": 0, "num_layers": 12, "gpu_type": "a100-40g", "tp": 1, "dp": 27,
     "replicas": [{"gpu_type": "a100-40g", "tp": 1, "count": 3, "micro_batch": 2},
                  {"gpu_type": "v100-16g", "tp": 4, "count": 24, "micro_batch": 2}]},
    {"first_layer": 12, "num_layers": 12, "gpu_type": "a100-40g", "tp": 1, "dp": 27}]}


@pytest.mark.parametrize("plan, published, M", [
    (_plan([(0, 4, "v100-16g", 1, 32), (4, 4, "v100-16g", 1, 32), (8, 4, "v100-16g", 1, 32),
            (12, 12, "a100-40g", 1, 32)], 1), 0.190, 32),
    (MIXED_32, 0.170, 19),
    (_plan([(*s, 20) for s in SAILOR_7], 1), 0.361, 52),
    (_plan([(*s, 32) for s in SAILOR_7], 1), 0.523, 32),
])
def test_published_fig8b_throughputs(plan, published, M):
    b = ss.score(plan)
    assert b.M == M
    assert round(b.its, 3) == published


def test_layer_mapping_covers_embedding_and_head():
    stages, _ = ss.stages_from_plan(MIXED_32)
    assert stages[0].layers == list(range(13)) and stages[1].layers == list(range(13, 26))
    assert [g for g, _ in stages[0].replicas].count("V100-16") == 24


def test_send_time_formula():
    # bandwidth a u^2 + b u + c GB/s at u = log2(MB); 8 MB -> u = 3
    assert ss.send_time(8e6, [0.0, 0.0, 2.0]) == pytest.approx(8e6 / 1e9 / 2.0)
    assert ss.ar_time(8e6, 4, [0.0, 0.0, 1.0]) == pytest.approx(2 * 3 * 2e6 / 1e9)
    assert ss.ar_time_with_buckets(1.2e9, 1, [0, 0, 1.0], 5e8) == 0.0


# ------------------------------------------------------------------ haap's eq. Q1 / Q2 p2p against the judge's

from haap_milp.catalog import load_cluster, load_model
from haap_milp.estimator import Estimator
from haap_milp.network import sailor as sailor_net
from haap_milp.network.merge import with_network
from haap_milp.network.spec import MeasuredNetwork
from haap_milp.specs import Plan, TrainingSpec

NET_JSON = ROOT / "tests" / "data" / "sailor_network" / "multizone_bandwidths_het.json"
HAAP = {"A100-40": "a100-40g", "V100-16": "v100-16g"}


@pytest.fixture(scope="module")
def est():
    net = MeasuredNetwork(links=tuple(sailor_net.import_links(NET_JSON, "us-central1-a", {})))
    tr = TrainingSpec(global_batch_size=1024, seq_len=2048, precision="fp32", engine="deepspeed",
                      distributed_optimizer=False, recompute_modes=("none",), uniform=("dp",))
    return Estimator(load_model("opt-350m"), with_network(load_cluster("a100-40g:80/4,v100-16g:240/4"), net), tr)


@pytest.mark.parametrize("mbs", [1, 2])
@pytest.mark.parametrize("ga, gb", [("A100-40", "A100-40"), ("A100-40", "V100-16"), ("V100-16", "A100-40"),
                                    ("V100-16", "V100-16")])
def test_replica_send_is_sailors_send_for_every_tp_pair(est, ga, gb, mbs):
    """Eq. Q1: one replica's send, tp GPUs on each side, is Sailor's estimate_send_time at
    bandwidths[g][min(tp, 4)][g'][min(tp', 4)] of the replica's whole activation (the imported table holds only
    equal GPU counts; the other entries follow from the two ends' own figures)."""
    d = ss.SailorData.load()
    x = d.act_bytes(1) * mbs
    for ta in (1, 2, 4):
        for tb in (1, 2, 4):
            want = ss.send_time(x, d.coef(ga, ta, gb, tb))
            got = est.replica_send_s((HAAP[ga], "main"), (HAAP[gb], "main"), ta, tb, mbs)
            assert got == pytest.approx(want, rel=1e-9), (ga, ta, gb, tb)


@pytest.mark.parametrize("dp", [20, 32])
def test_published_plan_boundaries_are_sailors_sends(est, dp):
    """Sailor's 7-stage plan (V100 tp 4, A100 tp 1): every boundary's round trip c_j is the activation send of
    stage j plus the gradient send of stage j+1 in Sailor's simulator, so a middle stage's eq. T2b charge
    (c_{j-1} + c_j) / 2 is exactly Sailor's p2p_j (before: tp 4 replicas priced as one stream, 40 % dearer)."""
    gbs = 1040 if dp == 20 else 1024
    plan = Plan.model_validate({
        "model": "opt-350m", "cluster": "a100-40g:80/4,v100-16g:240/4", "micro_batch_size": 1,
        "global_batch_size": gbs, "num_microbatches": gbs // dp, "seq_len": 2048, "precision": "fp32",
        "distributed_optimizer": False,
        "stages": [{"first_layer": f, "num_layers": n, "gpu_type": g, "tp": tp, "dp": dp} for f, n, g, tp in SAILOR_7]})
    c = est.estimate(plan).boundary_s
    b = ss.score(_plan([(*s, dp) for s in SAILOR_7], 1))
    assert len(c) == 6
    for j in range(1, 6):  # middle stages: p2p_j = act_j + grad_j
        assert (c[j - 1] + c[j]) / 2 == pytest.approx(b.p2p[j], rel=1e-9)



def _search_module():
    """benchmarks/sailor_sim_search.py, imported by path (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("sailor_sim_search", ROOT / "benchmarks" / "sailor_sim_search.py")
    se = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("sailor_sim_search", se)
    spec.loader.exec_module(se)
    return se

def test_exact_search_equals_enumeration_on_a_small_row():
    """benchmarks/sailor_sim_search.py's depth-first search with its bounds and symmetry rule finds the same
    optimum as scoring every pipeline of <= 4 stages (all kinds, all layer cuts) with the simulator's formulas."""
    import itertools

    se = _search_module()
    d = ss.SailorData.load()
    caps = {"A100-40": 32, "V100-16": 64}
    row, M = se.Row(d, caps, 16, 2), 1024 // 32
    best, _ = se.search(row, M, caps, float("inf"), max_stages=4)
    want = float("inf")
    for S in (1, 2, 3, 4):
        for kinds in itertools.product(row.kinds, repeat=S):
            use = {g: sum(k[1] * 16 for k in kinds if k[0] == g) for g in caps}
            if any(use[g] > caps[g] for g in caps):
                continue
            for inner in itertools.combinations(range(2, se.LAST), S - 1):
                want = min(want, se.total(row, M, list(kinds), [0, *inner, se.LAST + 1]))
    assert best[0] == pytest.approx(want, rel=1e-12)
    assert ss.score(se.plan_of(row, best[1], best[2]), 1024, d).iteration_s == pytest.approx(want, rel=1e-12)


def test_exact_search_keeps_a_known_plan_of_the_80_240_row():
    """The search's cuts are sound on the real row: with the incumbent just above the simulator's time of a known
    5-stage dp 32 plan (V100 tp2, V100 tp2, A100 tp1, A100 tp1, V100 tp2: 0.3458 it/s) it still finds one at
    least as fast."""
    se = _search_module()
    d = ss.SailorData.load()
    caps = {"A100-40": 80, "V100-16": 240}
    row = se.Row(d, caps, 32, 1)
    known = se.total(row, 32, [("V100-16", 2), ("V100-16", 2), ("A100-40", 1), ("A100-40", 1), ("V100-16", 2)],
                     [0, 5, 9, 16, 23, 26])
    best, _ = se.search(row, 32, caps, known * (1 + 1e-9), max_stages=5)
    assert best[1] is not None and best[0] <= known
