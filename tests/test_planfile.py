"""haap_milp.planfile: what solution_document writes, read_plan_file reads back unchanged; a bare Plan
is accepted; every malformed file is one HaapInputError naming the problem."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from spec_oracle import TINY_MODEL, TINY_TRAINING, tiny_cluster

from haap_milp.errors import HaapInputError
from haap_milp.planfile import PlanFile, read_plan_file, solution_document
from haap_milp.specs import Plan, SolveResult, StagePlan, Status

CLUSTER = tiny_cluster(10, 7, 5.0)
PLAN = Plan(model=TINY_MODEL.name, cluster=CLUSTER.name, stages=(
    StagePlan(first_layer=0, num_layers=1, gpu_type="a100-80g", island="east", tp=2, dp=1, recompute="full",
              time_s=0.004, memory_gib=6.5),
    StagePlan(first_layer=1, num_layers=3, gpu_type="h100-80g", island="west", tp=1, dp=2, time_s=0.005,
              memory_gib=5.25)),
    micro_batch_size=2, num_microbatches=2, global_batch_size=4, seq_len=2048)


def _write(tmp_path, doc, name="plan.json") -> pathlib.Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc) if not isinstance(doc, str) else doc, encoding="utf-8")
    return p


def test_solution_document_round_trip(tmp_path):
    res = SolveResult(status=Status.OPTIMAL, solver="cpsat", objective_s=0.0321, bound_s=0.032, gap=0.003,
                      plan=PLAN, message="", stats={"options_kept": 12})
    doc = solution_document(res, TINY_MODEL, CLUSTER, TINY_TRAINING, {"iteration_time_s": 0.0321})
    assert doc["status"] == "OPTIMAL" and doc["iteration_time_s"] == 0.0321
    got = read_plan_file(_write(tmp_path, doc))
    assert got == PlanFile(PLAN, TINY_MODEL, CLUSTER, TINY_TRAINING)
    assert got.plan.stages[0].recompute == "full" and got.plan.stages[1].island == "west"


def test_a_plan_naming_its_model_by_an_alias_is_read(tmp_path):
    """A bare plan's model named by a catalog alias loads that model; a file whose embedded model is the alias's
    model is not a mismatch (the mismatch check compares catalog names)."""
    for name in ("Llama-3-8B", "llama3-8b"):
        got = read_plan_file(_write(tmp_path, {**PLAN.model_dump(mode="json"), "model": name}))
        assert got.model is not None and got.model.name == "llama3-8b"
    doc = _good_doc()
    doc["plan"]["model"], doc["model"]["name"] = "Llama-3-8B", "llama3-8b"
    assert read_plan_file(_write(tmp_path, doc)).plan.model == "Llama-3-8B"


def test_bare_plan_is_accepted(tmp_path):
    got = read_plan_file(_write(tmp_path, PLAN.model_dump(mode="json")))
    assert got == PlanFile(PLAN)


def test_infeasible_solution_has_no_plan(tmp_path):
    res = SolveResult(status=Status.INFEASIBLE, solver="cpsat", message="memory binds")
    doc = solution_document(res, TINY_MODEL, CLUSTER, TINY_TRAINING, {})
    assert doc["plan"] is None
    with pytest.raises(HaapInputError, match=r"has no plan \(status 'INFEASIBLE'\)"):
        read_plan_file(_write(tmp_path, doc))


def _bad_stage(doc):
    doc["plan"]["stages"][1]["tp"] = 0
    return doc


def _good_doc():
    res = SolveResult(status=Status.OPTIMAL, solver="dp", objective_s=0.04, plan=PLAN)
    return solution_document(res, TINY_MODEL, CLUSTER, TINY_TRAINING, {})


def _bad_model(doc):
    doc["model"]["num_layers"] = -1
    return doc


@pytest.mark.parametrize("content, match", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "must hold a JSON object, got list"),
    ('"a string"', "must hold a JSON object, got str"),
    (json.dumps({"status": "OPTIMAL"}), "neither a 'plan' key"),  # neither a plan key nor a bare plan
    (json.dumps({"status": "OPTIMAL", "model": {"name": "m"}}), "neither a 'plan' key .* 'status', 'model'"),
    (json.dumps({**_good_doc(), "model": {**_good_doc()["model"], "name": "other"}}), "the plan says model"),
    (json.dumps(_bad_stage(_good_doc())), r"field plan\.stages\.1\.tp"),
    (json.dumps(_bad_model(_good_doc())), r"field model\.num_layers"),
    (json.dumps({**_good_doc(), "training": {**_good_doc()["training"], "gbs": 0}}), r"field training\.gbs"),
    (json.dumps({**_good_doc(), "training": [1]}), r"field 'training' must be a training mapping .*got list"),
    (json.dumps({**_good_doc(), "training": "x"}), r"field 'training' must be a training mapping .*got str"),
    (json.dumps({**_good_doc(), "model": 5}), r"field 'model' must be a model mapping or a catalog model name, got int"),
    (json.dumps({**_good_doc(), "cluster": [8]}), r"field 'cluster' must be a cluster mapping"),
    # the plan's own batch, sequence and precision against the embedded training block (the plan's won silently)
    (json.dumps({**_good_doc(), "training": {**_good_doc()["training"], "seq_len": 4096}}),
     r"plan\.seq_len is 2048 but training\.seq_len is 4096"),
    (json.dumps({**_good_doc(), "training": {**_good_doc()["training"], "global_batch_size": 8}}),
     r"plan\.global_batch_size is 4 but training\.global_batch_size is 8"),
    (json.dumps({**_good_doc(), "training": {**_good_doc()["training"], "precision": "fp16"}}),
     r"plan\.precision is 'bf16' but training\.precision is 'fp16'"),
])
def test_malformed_files(tmp_path, content, match):
    with pytest.raises(HaapInputError, match=match):
        read_plan_file(_write(tmp_path, content))


def test_missing_file_and_directory_and_bad_encoding(tmp_path):
    with pytest.raises(HaapInputError, match="does not exist; check the path"):
        read_plan_file(tmp_path / "nope.json")
    with pytest.raises(HaapInputError, match="is a directory"):
        read_plan_file(tmp_path)
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b'{"model": "caf\xe9"}')
    with pytest.raises(HaapInputError, match=r"is not UTF-8 text \(byte 0xe9"):
        read_plan_file(bad)
