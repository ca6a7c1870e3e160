"""TP all-reduce on Sailor's measured intra-VM GPU streams (tests/data/sailor_network/intra_node_bandwidths.json,
MIT): the ring's steps read the p2p curve at the step size M / tp, and the fp32 tp > 1 layer times then sit as
close to the measured OPT-350M profile (tests/data/profiles/OPT-350) as the tp 1 ones do."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from haap_milp.estimator import comm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import fp32_tp_analytic_vs_profile as bench


@pytest.fixture(scope="module")
def est():
    return bench.estimator(True)


def test_tp_ring_reads_the_measured_p2p_stream_at_the_step_size(est):
    hw = est.hardware("v100-16g")
    m = 16.8e6
    link, at = hw.tp_ring_step(m, 4)
    assert at == pytest.approx(m / 4)
    curve = next(lk for lk in est.cluster.network.links if lk.link == "intra_node" and lk.senders == 4
                 and lk.gpu_types == ("v100-16g",))
    assert link.bytes_per_s == pytest.approx(curve.bandwidth_gbps(m / 4) * 1e9)
    # 2(n-1) steps of M/n bytes each
    assert comm.ring("all_reduce", 4, link).time(m) == pytest.approx(6 * (m / 4) / link.bytes_per_s + 6 * link.latency_s)


def test_without_intra_node_figures_the_datasheet_nvlink_prices_tp():
    hw = bench.estimator(False).hardware("v100-16g")
    assert hw.tp_ring_step(16.8e6, 4) == (hw.nvlink, 16.8e6)


@pytest.mark.parametrize("gpu", ["V100", "A100"])
@pytest.mark.parametrize("mbs", [2, 4])
def test_fp32_tp4_layer_as_close_to_the_profile_as_tp1(est, gpu, mbs):
    """V100 / A100 tp 4 at the micro-batches haap's fp32 plans pick: within 25 % of the measured layer, and no more
    than 10 points further from it than tp 1 (the datasheet-NVLink price was 0.78-0.80 against 0.84-0.89)."""
    name = bench.DEVICES[gpu]
    r4 = est.layer_cost(name, 4, 1, 1, 1, "none", mbs).time_s * 1e3 / bench.measured_ms(gpu, 4, mbs)
    r1 = est.layer_cost(name, 1, 1, 1, 1, "none", mbs).time_s * 1e3 / bench.measured_ms(gpu, 1, mbs)
    assert r4 == pytest.approx(1.0, abs=0.25)
    assert r4 > r1 - 0.10
