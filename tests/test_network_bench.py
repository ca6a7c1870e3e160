"""Bench specs: a cluster entry's ``network:`` is merged into the cluster, as ``--network`` does."""

from __future__ import annotations

from pathlib import Path

import yaml

from haap_milp.bench.run import plan_tasks, run_task
from haap_milp.bench.spec import parse_spec
from haap_milp.network import sailor
from haap_milp.network.spec import MeasuredNetwork

SAILOR = Path(__file__).parent / "data" / "sailor_network" / "multizone_bandwidths_het.json"
CLUSTER = "a100-40g:32/4,v100-16g:96/4"


def _objective(network: str | None) -> dict:
    entry = {"cluster": CLUSTER, "label": "fig8b", "precision": "fp16", **({"network": network} if network else {})}
    spec = parse_spec({"name": "t", "models": ["opt-350m"], "clusters": [entry], "gbs": [1024], "seq": [2048],
                       "methods": ["dp"]})
    (task,), _ = plan_tasks(spec, set())
    assert task.inputs.network == network
    (row,) = run_task(task)
    return row


def test_bench_cluster_network_changes_the_result_and_bad_files_are_error_rows(tmp_path):
    net = tmp_path / "net.yaml"
    net.write_text(yaml.safe_dump(MeasuredNetwork(links=tuple(sailor.import_links(SAILOR, "us-central1-a", {})))
                                  .model_dump(mode="json")))
    plain, measured = _objective(None), _objective(str(net))
    assert plain["status"] == measured["status"] == "FEASIBLE"
    assert float(measured["objective_s"]) > float(plain["objective_s"])  # about 6 GB/s per VM, not 100 x efficiency
    bad = _objective(str(tmp_path / "missing.yaml"))
    assert bad["status"] == "ERROR" and "network" in bad["message"] and "missing.yaml" in bad["message"]
