"""Measured networks in the estimator: sharing, message sizes, direction of the change, and no change without one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import invoke_cli

from haap_milp.catalog import load_cluster, load_model
from haap_milp.errors import HaapInputError
from haap_milp.estimator import Estimator
from haap_milp.network import pricing, sailor
from haap_milp.network.merge import apply_network_option, with_network
from haap_milp.network.spec import MeasuredLink, MeasuredNetwork
from haap_milp.specs import Plan, StagePlan, TrainingSpec

DATA = Path(__file__).parent / "data"
SAILOR = DATA / "sailor_network" / "multizone_bandwidths_het.json"
CLUSTER = "a100-40g:32/4,v100-16g:96/4"
A, V = ("a100-40g", "main"), ("v100-16g", "main")


@pytest.fixture(scope="module")
def sailor_net() -> MeasuredNetwork:
    return MeasuredNetwork(links=tuple(sailor.import_links(SAILOR, "us-central1-a", {})))


def _flat(link: str, types: tuple[str, ...], gbps: float, per: str = "node_nic", senders: int = 4,
          op: str = "p2p") -> MeasuredLink:
    return MeasuredLink(link=link, gpu_types=types, per=per, senders=senders, op=op,
                        curve={"kind": "table", "points": [{"message_bytes": 1e6, "bandwidth_gbps": gbps}]})


def _training(dist: bool = False) -> TrainingSpec:
    return TrainingSpec(global_batch_size=1024, seq_len=2048, precision="fp16", distributed_optimizer=dist)


def _plan() -> Plan:
    """Two stages of OPT-350M on the Fig-8b cluster: V100 tp 2 x dp 32, A100 tp 1 x dp 32."""
    return Plan(model="opt-350m", cluster=CLUSTER, stages=(
        StagePlan(first_layer=0, num_layers=12, gpu_type="v100-16g", island="main", tp=2, dp=32, recompute="none"),
        StagePlan(first_layer=12, num_layers=12, gpu_type="a100-40g", island="main", tp=1, dp=32, recompute="none")),
        micro_batch_size=1, num_microbatches=32, global_batch_size=1024, seq_len=2048, precision="fp16")


def _est(net: MeasuredNetwork | None = None, dist: bool = False) -> Estimator:
    c = load_cluster(CLUSTER)
    return Estimator(load_model("opt-350m"), c if net is None else with_network(c, net), _training(dist))


def test_without_a_network_estimates_are_unchanged():
    """Numbers of the analytic network (no measured one), to the last bit; they move only with calibration.json
    (last: the issue-12 refit of 2026-12-01, after the memory and time rounds merged)."""
    est = _est()
    pe = est.estimate(_plan())
    assert pe.iteration_time_s == 0.8692318394282502
    assert [s.time_s for s in pe.stages] == [0.02392187200249007, 0.024880205709300225]
    assert est.layer_cost("a100-40g", 1, 32, 1, 1, "none", 32).dp_comm_s == 0.0006797157550527903
    assert est.layer_cost("v100-16g", 2, 32, 1, 1, "none", 32).tp_comm_s == 0.0001156099946274306
    assert est.p2p_time(V, A, 32) == 0.001589032094117647
    hw = est.hardware("a100-40g")
    assert hw.network is None and hw.intra(1e6, 4) is hw.nvlink and hw.nic_gpu_at(1e6) is hw.nic_gpu
    assert hw.dp_links("all_reduce", 8, 1, 2.0) == (hw.nvlink, hw.nic_node)


def test_sharing_rule_on_sailor_figures(sailor_net):
    links = pricing.links_of(sailor_net, "inter_node", ("a100-40g",), "main")
    one = links[0].bandwidth_gbps(8e6)
    exact = {k: pricing.aggregate_gbps(links, k, 8e6)[0] for k in (1, 2, 3, 4, 8)}
    assert exact[1] == pytest.approx(1.517, abs=0.005)  # one GPU's stream as measured
    assert exact[2] == pytest.approx(2.743, abs=0.005)  # the n = 2 figure as measured
    assert exact[4] == pytest.approx(5.661, abs=0.005)  # the whole VM as measured, not 4 x 1.517
    assert exact[3] == pytest.approx(min(3 * one, exact[4]))  # streams add up to the node's figure
    assert exact[8] == pytest.approx(exact[4])  # more senders than measured: the node's NIC is the limit


def test_measured_dp_collective_uses_the_node_figure_at_the_bucket_size(sailor_net):
    est = _est(sailor_net)
    hw = est.hardware("a100-40g")
    nv, node = hw.dp_links("all_reduce", 32, 1, 2.0)
    bucket = 40e6 * 2.0  # Megatron-Core default bucket (dp 32 < 40) x fp16 gradients
    a4 = next(lk for lk in sailor_net.links if lk.link == "inter_node" and lk.gpu_types == ("a100-40g",)
              and lk.senders == 4)
    assert node.bytes_per_s == a4.bandwidth_gbps(bucket) * 1e9  # as measured: no efficiency factor
    assert nv is hw.nvlink  # no intra-node figure: the datasheet link stays
    small = _est(sailor_net.model_copy(update={"dp_bucket_bytes": 1e6}))
    big = _est(sailor_net.model_copy(update={"dp_bucket_bytes": 5e8}))
    dp_small = small.layer_cost("a100-40g", 1, 32, 1, 1, "none", 32).dp_comm_s
    dp_big = big.layer_cost("a100-40g", 1, 32, 1, 1, "none", 32).dp_comm_s
    assert dp_small > dp_big  # the Sailor curve is faster for larger messages


def test_slow_measured_network_makes_the_plan_slower(sailor_net):
    base, measured = _est(), _est(sailor_net)
    # datasheet: 100 GB/s per 4-GPU A100 node x efficiency; measured: about 6 GB/s for the VM
    assert measured.layer_cost("a100-40g", 1, 32, 1, 1, "none", 32).dp_comm_s > \
        10 * base.layer_cost("a100-40g", 1, 32, 1, 1, "none", 32).dp_comm_s
    assert measured.p2p_time(V, A, 32) > 5 * base.p2p_time(V, A, 32)
    assert measured.estimate(_plan()).iteration_time_s > base.estimate(_plan()).iteration_time_s
    # TP stays inside a node and Sailor's VM-to-VM file has no intra-node figure: unchanged
    assert measured.layer_cost("v100-16g", 2, 32, 1, 1, "none", 32).tp_comm_s == \
        base.layer_cost("v100-16g", 2, 32, 1, 1, "none", 32).tp_comm_s


def test_fast_measured_network_makes_the_plan_faster_and_is_used_as_given():
    """A figure above the datasheet's achievable bandwidth is used as given (no efficiency factor)."""
    fast = MeasuredNetwork(links=(
        _flat("intra_node", ("v100-16g",), 1000.0, per="gpu_stream", senders=4, op="all_reduce"),
        _flat("inter_node", ("a100-40g",), 1000.0), _flat("inter_node", ("v100-16g",), 1000.0)))
    base, measured = _est(), _est(fast)
    assert measured.estimate(_plan()).iteration_time_s < base.estimate(_plan()).iteration_time_s
    assert measured.layer_cost("v100-16g", 2, 32, 1, 1, "none", 32).tp_comm_s < \
        base.layer_cost("v100-16g", 2, 32, 1, 1, "none", 32).tp_comm_s
    hw = measured.hardware("v100-16g")
    assert hw.intra(4e6, 2).bytes_per_s == 1000e9
    assert hw.nic_gpu_at(4e6).bytes_per_s == 1000e9 / 4  # the node's figure shared by its 4 GPUs


def test_cross_type_p2p_prices_each_direction_on_its_own_figure():
    """Forward activations V -> A and backward gradients A -> V; streams = 32 (the smaller group), 4 per node."""
    net = MeasuredNetwork(links=(_flat("cross_type", ("v100-16g", "a100-40g"), 2.0),
                                 _flat("cross_type", ("a100-40g", "v100-16g"), 8.0)))
    est = _est(net)
    total = 32 * 2048 * 1024 * 2.0  # 32 samples x seq x hidden, 16-bit
    streams = 32
    per_gpu = {"va": 2.0e9 / 4, "av": 8.0e9 / 4}
    expected = total / (streams * per_gpu["va"]) + total / (streams * per_gpu["av"])
    assert est.p2p_time(V, A, 32) == pytest.approx(expected)
    assert est.p2p_time(A, V, 32) == pytest.approx(expected)


def test_network_naming_a_type_the_cluster_lacks_is_an_error(sailor_net, tmp_path):
    c = load_cluster("a100-40g:32/4")
    with pytest.raises(HaapInputError, match=r"--network.*v100-16g.*does not have"):
        with_network(c, sailor_net)
    f = tmp_path / "net.yaml"
    f.write_text(yaml.safe_dump(sailor_net.model_dump(mode="json")))
    assert apply_network_option(load_cluster(CLUSTER), str(f)).network == sailor_net
    assert apply_network_option(c, None) is c


# nine levels of nine aliases each: 9**9 values once expanded (a "billion laughs" file)
_ALIAS_BOMB = "l0: &l0 [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9)) + "links: *l8\n"


@pytest.mark.parametrize(("content", "needle"), [
    (None, "is not a file"),
    ("links: [", "is not valid YAML"),
    ("- 1\n- 2\n", "must be a mapping"),
    ("links: .nan\n", "field links is nan"),  # (the package's bounded loader, as every other input file)
    (_ALIAS_BOMB, "expands to more than"),
    ("links: []\n", "is not a valid network description: field 'links' = []"),
])
def test_network_file_errors_exit_2(tmp_path, content, needle):
    f = tmp_path / "net.yaml"
    if content is not None:
        f.write_text(content)
    code, _, err = invoke_cli(["estimate", "-m", "opt-350m", "-c", "a100-40g:8/4", "--gbs", "8", "--precision", "fp16",
                               "--dp", "8", "--network", str(f)])
    msg = " ".join(err.split())
    assert code == 2 and f"--network '{f}'" in msg and needle in msg and "Traceback" not in err


def test_solve_estimate_simulate_with_network_end_to_end(tmp_path):
    net = tmp_path / "net.yaml"
    code, _, err = invoke_cli(["network", "import", "--format", "sailor", str(SAILOR), "--zone", "us-central1-a",
                               "-o", str(net)])
    assert code == 0, err
    common = ["-m", "opt-350m", "-c", CLUSTER, "--gbs", "1024", "--seq", "2048", "--precision", "fp16",
              "--solver", "dp"]
    code, _, err = invoke_cli(["solve", *common, "--network", str(net), "--json", str(tmp_path / "plan.json")])
    assert code == 0, err
    code, out, err = invoke_cli(["estimate", "--plan", str(tmp_path / "plan.json"), "--json"])
    assert code == 0, err
    import json

    with_net = json.loads(out)["iteration_time_s"]
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert doc["cluster"]["network"]["links"]  # the plan file carries the measured network
    code, out, err = invoke_cli(["estimate", "--plan", str(tmp_path / "plan.json"), "--json", "--network", str(net)])
    assert code == 0 and json.loads(out)["iteration_time_s"] == with_net
    code, out, err = invoke_cli(["simulate", str(tmp_path / "plan.json"), "--json", "--network", str(net)])
    assert code == 0, err
    assert json.loads(out)["estimator_iteration_s"] == pytest.approx(with_net)
    code, out, err = invoke_cli(["compare", *common[:-2], "--time-limit", "2", "--json", "--network", str(net)])
    assert code == 0, err


def test_figure_measured_with_the_same_collective_is_preferred():
    net = MeasuredNetwork(links=(_flat("inter_node", ("a100-40g",), 10.0, op="all_reduce"),
                                 _flat("inter_node", ("a100-40g",), 1.0, op="sendrecv")))
    hw = _est(net).hardware("a100-40g")
    assert hw.dp_links("all_reduce", 32, 1, 2.0)[1].bytes_per_s == 10e9
    assert hw.dp_links("reduce_scatter", 32, 1, 2.0)[1].bytes_per_s == 1e9  # no reduce-scatter figure: any figure
    assert hw.nic_gpu_at(4e6, "sendrecv").bytes_per_s == 1e9 / 4


def test_inter_island_figure_bounds_p2p_between_islands():
    cluster = load_cluster("a100-40g:8/4@x,a100-40g:8/4@y")
    net = MeasuredNetwork(links=(
        MeasuredLink(link="inter_island", islands=("x", "y"), per="node_nic", senders=8, latency_us=100.0,
                     curve={"kind": "table", "points": [{"message_bytes": 1e6, "bandwidth_gbps": 1.0}]}),
        MeasuredLink(link="inter_island", islands=("y", "x"), per="node_nic", senders=8, latency_us=100.0,
                     curve={"kind": "table", "points": [{"message_bytes": 1e6, "bandwidth_gbps": 2.0}]})))
    est = Estimator(load_model("opt-350m"), with_network(cluster, net), _training())
    nic_lat = est.hardware("a100-40g", "x").nic_gpu.latency_s
    total = 8 * 2048 * 1024 * 2.0
    expected = total / 1e9 + total / 2e9 + 2 * (nic_lat + 100e-6)  # the island link is far below the NICs
    assert est.p2p_time(("a100-40g", "x"), ("a100-40g", "y"), 8) == pytest.approx(expected, rel=1e-12)
