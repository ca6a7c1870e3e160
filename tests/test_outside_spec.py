"""benchmarks/specs/outside.yaml (the held-out sets of benchmarks/outside_sweep.py) loads with the script's own
loader: every set has instances, every entry parses, and every model and cluster resolves with the loaders the CLI's
`-m` and `-c` use; a malformed entry and an unknown set are refused. Nothing is solved."""

from __future__ import annotations

import outside_sweep
import pytest

from haap_milp.catalog import load_cluster, load_model

SPEC = outside_sweep.ROOT / "benchmarks/specs/outside.yaml"


def test_every_set_has_instances_that_resolve():
    sets = outside_sweep.load_sets(SPEC)
    assert sets
    for name, insts in sets.items():
        assert insts, name
        assert all(i.gbs >= 1 and i.seq >= 1 for i in insts), name
    every = [i for insts in sets.values() for i in insts]
    for model in sorted({i.model for i in every}):
        load_model(model)
    for cluster in sorted({i.cluster for i in every}):
        load_cluster(cluster)


def test_entries_parse_and_a_malformed_one_names_its_set():
    assert outside_sweep.parse_instance(" llama3-8b | h100-80g:8,a100-80g:8 | 64 | 8192 ", "s") == \
        outside_sweep.Instance("llama3-8b", "h100-80g:8,a100-80g:8", 64, 8192)
    for bad in ("llama3-8b | h100-80g:8 | 64", "llama3-8b | h100-80g:8 | 64 | x", " | h100-80g:8 | 64 | 8192"):
        with pytest.raises(ValueError, match=r"set 'fresh99'.*" + bad.split("|")[0].strip()):
            outside_sweep.parse_instance(bad, "fresh99")


def test_an_instance_in_two_sets_is_solved_once_and_counted_in_both():
    a = outside_sweep.Instance("m", "c1", 8, 1024)
    b = outside_sweep.Instance("m", "c2", 8, 1024)
    plan = outside_sweep.schedule({"x": [a, b], "y": [b]}, ["x", "y"], None)
    assert plan == {a: ["x"], b: ["x", "y"]}
    assert outside_sweep.schedule({"x": [a, b], "y": [b]}, ["x", "y"], "c2") == {b: ["x", "y"]}


def test_unknown_set_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        outside_sweep.main(["--sets", "no-such-set"])
    assert exc.value.code == 2
    assert "no-such-set" in capsys.readouterr().err
