"""haap_milp.explain: the bottleneck it names is the one the numbers say, and the infeasibility reason
names the limit that really binds (relaxing that limit makes the instance feasible)."""

from __future__ import annotations

import math
import pathlib
import re
import sys
from dataclasses import replace

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from problem_io import PINNED, assignment_from_dict, load_pinned
from spec_oracle import TINY_MODEL, TINY_TRAINING, tiny_cluster

from haap_milp import explain, planner, presolve
from haap_milp.catalog import load_cluster
from haap_milp.estimator import Estimator
from haap_milp.pipeline import steady_period
from haap_milp.problem import boundary_times, stage_memory, stage_times
from haap_milp.solvers import get_solver
from haap_milp.specs import SolveOptions

BRUTE = get_solver("brute")


def _pinned(name):
    problem, doc = load_pinned(PINNED / f"{name}.json")
    return problem, assignment_from_dict(doc["optimum"]["assignment"])


@pytest.mark.parametrize("name", ["memory-bound", "t3-sync", "uniform-target", "t2-round-trip"])
def test_bottleneck_names_the_slowest_stage_and_the_gpu_use(name):
    problem, a = _pinned(name)
    text = explain.bottleneck(problem, a, problem.groups)
    t = stage_times(problem, a)
    j = int(np.argmax(t))
    label = problem.groups[problem.options[a.stages[j].option].group]
    assert text.startswith(f"stage {j} ({label}) is the slowest at {t[j] * 1e3:.1f} ms"), text
    used = [0] * len(problem.groups)
    for st in a.stages:
        used[problem.options[st.option].group] += problem.options[st.option].num_gpus
    for g, (u, cap) in enumerate(zip(used, problem.group_capacity)):
        if u == cap:
            assert re.search(r"all GPUs of [^;]*" + re.escape(problem.groups[g]), text), (g, text)
        elif u < cap:
            assert f"{problem.groups[g]} ({cap - u} idle)" in text, (g, text)
    var = problem.variants[a.variant]
    full = stage_memory(problem, a)[j] / var.mem_capacity[a.stages[j].option] > 0.9
    assert ("memory is" in text) == full


def test_bottleneck_reports_the_window_or_round_trip_that_sets_the_period():
    problem, a = _pinned("t2-round-trip")
    t, c = stage_times(problem, a), boundary_times(problem, a)
    m, p = problem.variants[a.variant].num_microbatches, len(t)
    tau = steady_period(t, c, m)
    assert tau > max(max(t), max(c) / 2)
    # the window j..k of eq. T2 that sets it, found by slicing: one that ends before the last stage here
    lo, hi = max(((j, k) for j in range(p) if p - j < m for k in range(j + 1, p)),
                 key=lambda w: (sum(t[w[0]:w[1] + 1]) + sum(c[w[0]:w[1]])) / (w[1] - w[0] + 1))
    assert hi < p - 1
    text = explain.bottleneck(problem, a, problem.groups)
    assert f"stages {lo}-{hi} and the links between them (a 1F1B cycle of {hi - lo + 1} micro-batches) stretch the " \
           f"period to {tau * 1e3:.1f} ms" in text, text


def test_bottleneck_names_the_slowest_link_when_links_pace():
    problem, a = _pinned("t2-round-trip")
    # slow links and one micro-batch (so no round-trip wait): the link sets the period
    slow = replace(problem, variants=tuple(replace(v, p2p_time=v.p2p_time * 1000, num_microbatches=1)
                                           for v in problem.variants))
    c = boundary_times(slow, a)
    k = int(np.argmax(c))
    assert max(c) / 2 > max(stage_times(slow, a))
    assert steady_period(stage_times(slow, a), c, 1) == pytest.approx(max(c) / 2)
    text = explain.bottleneck(slow, a, slow.groups)
    assert text.startswith(f"the link between stages {k} and {k + 1} ({c[k] * 1e3:.1f} ms"), text


def test_estimate_bottleneck_names_the_pacing_stage():
    cluster = tiny_cluster(10, 7)
    est = Estimator(TINY_MODEL, cluster, TINY_TRAINING)
    pre = presolve.build(TINY_MODEL, cluster, TINY_TRAINING, SolveOptions(max_stages=3), est)
    a = BRUTE(pre.problem).assignment
    assert len(a.stages) >= 2
    pe = est.estimate(presolve.decode(pre, a, TINY_MODEL, cluster, TINY_TRAINING))
    j = max(range(len(pe.stages)), key=lambda i: pe.stages[i].time_s)
    s = pe.stages[j]
    text = explain.estimate_bottleneck(pe)
    assert text.startswith(f"stage {j} ({s.gpu_type}, {s.num_layers} layers) paces the pipeline at "
                           f"{s.time_s * 1e3:.1f} ms"), text


def _reason(cluster, options):
    ctx = planner.Context.build(TINY_MODEL, cluster, TINY_TRAINING, options)
    feasible = bool(ctx.presolved.problem.variants) and BRUTE(ctx.presolved.problem).status == "OPTIMAL"
    return explain.infeasibility_reason(ctx), feasible


def test_memory_bound_reason_and_its_remedy():
    cluster = tiny_cluster(6, 4)
    text, feasible = _reason(cluster, SolveOptions())  # no stage cap: memory alone binds
    assert not feasible
    m = re.search(r"^memory binds: .* hold about (\d+) of the (\d+) layers .* it needs about (\d+) more (\S+) GPUs",
                  text)
    assert m, text
    held, layers, more, gpu = int(m[1]), int(m[2]), int(m[3]), m[4]
    assert layers == TINY_MODEL.num_layers and held < layers
    # the remedy it names works: that many more GPUs of that type (whole nodes of 2) make a plan fit
    groups = tuple(ng.model_copy(update={"num_nodes": ng.num_nodes + math.ceil(more / ng.gpus_per_node)})
                   if ng.gpu.name == gpu else ng for ng in cluster.node_groups)
    assert _reason(cluster.model_copy(update={"node_groups": groups}), SolveOptions())[1]
    # and it is memory: 10x the memory of every GPU fits too
    roomy = tuple(ng.model_copy(update={"gpu": ng.gpu.model_copy(update={"memory_gib": 10 * ng.gpu.memory_gib})})
                  for ng in cluster.node_groups)
    assert _reason(cluster.model_copy(update={"node_groups": roomy}), SolveOptions())[1]


def test_one_layer_reason_quotes_need_above_capacity():
    text, feasible = _reason(tiny_cluster(2, 2), SolveOptions())
    assert not feasible
    m = re.search(r"one decoder layer needs ([\d.]+) GiB per GPU .* which has ([\d.]+) GiB usable", text)
    assert m, text
    assert float(m[1]) > float(m[2])


def test_stage_cap_reason():
    cluster = tiny_cluster(6, 5)
    text, feasible = _reason(cluster, SolveOptions(max_stages=1))
    assert not feasible
    assert text.startswith("no plan fits within 1 pipeline stages"), text
    assert _reason(cluster, SolveOptions(max_stages=3))[1]  # lifting the named limit helps


def test_precision_reason():
    ctx = planner.Context.build(TINY_MODEL, load_cluster("v100-16g:2/2"), TINY_TRAINING, SolveOptions())
    text = explain.infeasibility_reason(ctx)
    assert text.startswith("no GPU type of the cluster supports precision bf16") and "fp16" in text


def test_profile_whose_measured_points_are_all_out_of_memory_is_infeasible_with_memory_binds(tmp_path, run_cli):
    """A profile that measures only tp 1, every micro-batch far past an 80 GB GPU (90000 MiB per layer): under the
    default --profile-fallback none the points it lacks leave the search (README, "Profiles"), so the problem is
    INFEASIBLE and the reason is the measured memory, once (it was exit 2: 'tp 4, micro-batch 1 is not measured',
    from pricing a point the profile does not cover)."""
    import json

    prof = tmp_path / "oom.json"
    prof.write_text(json.dumps({"haap_profile": 1, "entries": [
        {"gpu": "a100-80g", "tp": 1, "mbs": m, "layer_time_ms": 5.0, "layer_memory_mib": 90000} for m in (1, 2, 4, 8)]}))
    out = tmp_path / "r.json"
    code, stdout, err = run_cli(["solve", "-m", "gpt3-125m", "-c", "a100-80g:8", "--time-limit", "3", "--seq", "1024",
                                 "--profile", str(prof), "--json", str(out)])
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["status"] == "INFEASIBLE"
    assert doc["message"].startswith("memory binds: one decoder layer needs") and "measured" in doc["message"]
    assert "not measured" not in doc["message"] and "tp=1" in doc["message"]
    code, stdout, err = run_cli(["solve", "-m", "gpt3-125m", "-c", "a100-80g:8", "--time-limit", "3", "--seq", "1024",
                                 "--profile", str(prof)])
    assert code == 0 and " ".join(stdout.split()).count("memory binds") == 1 and "error" not in err, (stdout, err)
    # a profile that covers none of the points the search needs (only micro-batch 16): the reason says so
    prof.write_text(json.dumps({"haap_profile": 1, "entries": [
        {"gpu": "a100-80g", "tp": 1, "mbs": 16, "layer_time_ms": 5.0, "layer_memory_mib": 100}]}))
    code, _, err = run_cli(["solve", "-m", "gpt3-125m", "-c", "a100-80g:8", "--time-limit", "3", "--seq", "1024",
                            "--profile", str(prof), "--json", str(out)])
    doc = json.loads(out.read_text())
    assert code == 0 and doc["status"] == "INFEASIBLE", err
    assert doc["message"].startswith("no option can be priced") and "--profile-fallback analytic" in doc["message"]


def test_bottleneck_reports_the_interleaved_window_that_sets_the_period():
    """Eq. I7: on an interleaved plan whose period a window of ranks and their links sets (a random two-island
    problem copied as vpp 2 and 3, its link 2 layer times), the text names that window, found by slicing."""
    from synthetic import feasible_plans
    from test_interleaved_links import interleaved_islands
    from test_pipeline_closed_forms import interleaved_windows_sliced

    from haap_milp.pipeline import interleaved_period
    from haap_milp.problem import wrap_time

    for seed in range(6):
        problem = interleaved_islands(seed, 2.0)
        for a in feasible_plans(problem) if problem is not None else ():
            var = problem.variants[a.variant]
            t, c, cw = stage_times(problem, a), boundary_times(problem, a), wrap_time(problem, a)
            if var.vpp < 2:
                continue
            tau = interleaved_period(t, c, var.num_microbatches, var.vpp, cw)
            win, lo, hi = max(interleaved_windows_sliced(t, c, cw, var.num_microbatches, var.vpp))
            if tau <= max(t) * (1 + 1e-6) or win < tau * (1 - 1e-9):
                continue
            text = explain.bottleneck(problem, a, problem.groups)
            span = f"stages {lo}-{hi}" if lo < hi else f"stages {lo}-{len(t) - 1} and 0-{hi} (through the wrap)"
            assert f"{span} and the links between them, each crossed {var.vpp} times per micro-batch" in text, text
            assert f"stretch the period to {tau * 1e3:.1f} ms (eq. I7)" in text, text
            return
    raise AssertionError("no interleaved plan whose period an eq. I7 window sets")
