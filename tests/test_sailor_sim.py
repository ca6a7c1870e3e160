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
