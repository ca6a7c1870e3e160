"""Prices, power and the cost / energy metrics (eqs. E1-E5), the pool, and the commands that use them."""

from __future__ import annotations

import itertools
import json

import pytest

from haap_milp import economics
from haap_milp.catalog.prices import load_prices
from haap_milp.errors import HaapInputError
from haap_milp.specs import Plan, StagePlan

TINY = ["-m", "tests/data/models/tiny-4l.yaml", "-c", "h100-80g:2/2,a100-80g:2/2", "--gbs", "4", "--seq", "2048"]


def test_catalog_prices_and_power():
    book = load_prices()
    assert book.usd_per_gpu_hour("a100-80g") == pytest.approx(40.9657 / 8, abs=1e-4)  # p4de.24xlarge / 8
    assert book.usd_per_gpu_hour("h100-80g") == pytest.approx(98.32 / 8)
    assert book.tdp_w("h100-80g") == 700 and book.idle_w("h100-80g") == pytest.approx(0.15 * 700)
    spot = load_prices(kind="spot")  # one SkyPilot-catalog snapshot: median of the us-east-1 zones / GPUs
    assert spot.usd_per_gpu_hour("h100-80g") == pytest.approx(26.7861 / 8, abs=1e-4)  # p5.48xlarge
    assert spot.usd_per_gpu_hour("a100-40g") == pytest.approx(6.7915 / 8, abs=1e-4)  # p4d.24xlarge
    assert spot.usd_per_gpu_hour("l4-24g") is None  # not transcribed: no number without a source
    assert load_prices(kind="on-demand") is book  # the CLI spelling; the catalog's book is parsed once


def test_every_catalog_price_has_its_source():
    """Each on-demand price names its instance and each spot price is in the header's table (source, zones)."""
    from importlib import resources

    import yaml

    text = resources.files("haap_milp.catalog").joinpath("prices.yaml").read_text()
    doc = yaml.safe_load(text)
    assert "skypilot-catalog" in text and "001367d22a0033fac286a8c71aeac7109e431bcb" in text
    for gpu, row in doc["gpus"].items():
        if row.get("on_demand_usd_per_gpu_hour") is not None:
            assert row.get("instance") and f"{row['instance']} " in text.split("date:")[0], gpu
        if row.get("spot_usd_per_gpu_hour") is not None:
            assert f"-> {gpu} {row['spot_usd_per_gpu_hour']:.4f}" in text, gpu


def test_user_prices_override_only_what_they_give(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("gpus:\n  A100-80GB: {spot_usd_per_gpu_hour: 1.5, idle_w: 50}\n  my-gpu: {tdp_w: 100}\n")
    book = load_prices(str(f), "spot")
    assert book.usd_per_gpu_hour("a100-80g") == 1.5  # alias resolved
    assert book.idle_w("a100-80g") == 50 and book.tdp_w("a100-80g") == 400  # tdp kept from the catalog
    assert book.idle_w("my-gpu") == pytest.approx(15.0)  # a GPU the catalog does not know


@pytest.mark.parametrize("text,field", [("gpus:\n  a100-80g: {tdp: 3}\n", "gpus.a100-80g.tdp"),
                                        ("gpus:\n  a100-80g: {tdp_w: -3}\n", "gpus.a100-80g.tdp_w"),
                                        ("price: 3\n", "price")])
def test_bad_prices_file_names_the_field(tmp_path, text, field):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(HaapInputError) as exc:
        load_prices(str(f))
    assert field in str(exc.value)


class _Est:  # the two fields plan_economics reads from a PlanEstimate
    def __init__(self, t, stage_times):
        self.iteration_time_s = t
        self.stages = [type("S", (), {"time_s": x})() for x in stage_times]


def test_plan_economics_by_hand():
    plan = Plan(model="m", stages=(StagePlan(first_layer=0, num_layers=2, gpu_type="h100-80g", tp=2, dp=2),
                                   StagePlan(first_layer=2, num_layers=2, gpu_type="a100-80g", tp=1, dp=2)),
                micro_batch_size=1, num_microbatches=8, global_batch_size=16, seq_len=1000)
    book = load_prices()
    got = economics.plan_economics(plan, _Est(10.0, [1.0, 0.5]), book)
    rate = 4 * 12.29 + 2 * 5.1207
    assert got["usd_per_hour"] == pytest.approx(rate)
    assert got["usd_per_iteration"] == pytest.approx(10 * rate / 3600)
    assert got["usd_per_million_tokens"] == pytest.approx(10 * rate / 3600 / 16000 * 1e6)
    # eq. E3: u = M t / T = 0.8 and 0.4; P = idle + (tdp - idle) u per GPU
    p_h, p_a = 105 + (700 - 105) * 0.8, 60 + (400 - 60) * 0.4
    energy = 10 * (4 * p_h + 2 * p_a)
    assert got["joules_per_iteration"] == pytest.approx(energy)
    assert got["joules_per_token"] == pytest.approx(energy / 16000)
    r_idle, dyn, e = economics.energy_parts(plan, [1.0, 0.5], 10.0, book)
    assert e == pytest.approx(10 * r_idle + dyn) and r_idle == pytest.approx(4 * 105 + 2 * 60)  # eq. E4


def test_solve_reports_cost_energy_pool_and_objective_cost(run_cli, tmp_path):
    out = tmp_path / "plan.json"
    code, stdout, err = run_cli(["solve", *TINY, "--objective", "cost", "--max-points", "6", "--step", "0",
                                  "--gap", "0", "--json", str(out)])
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["objective"]["objective"] == "cost" and doc["objective"]["frontier_complete"]
    assert doc["usd_per_iteration"] == pytest.approx(doc["objective"]["usd_per_iteration"])
    assert doc["objective"]["objective_gap"] < 1e-3
    assert doc["joules_per_token"] > 0 and doc["usd_per_million_tokens"] > 0
    used = sum(r["used"] for r in doc["gpu_pool"].values())
    assert used < sum(r["available"] for r in doc["gpu_pool"].values())  # the cheapest plan leaves GPUs idle
    assert "cost " in stdout and "pool " in stdout and "objective   cost" in stdout
    assert len(doc["sensitivity"]) == len(doc["plan"]["stages"])


def test_solve_bounds_and_bad_flags(run_cli):
    code, stdout, _ = run_cli(["solve", *TINY, "--max-cost-per-hour", "1", "--json", "-"])
    doc = json.loads(stdout)
    assert code == 0 and doc["status"] == "INFEASIBLE" and "1 $/h" in doc["message"]
    code, stdout, _ = run_cli(["solve", *TINY, "--max-cost-per-hour", "20", "--json", "-"])
    doc = json.loads(stdout)
    assert doc["usd_per_hour"] <= 20 and doc["status"] == "OPTIMAL"
    for args, flag in ((["--objective", "money"], "--objective"), (["--robust", "-5"], "--robust"),
                       (["--objective", "energy", "--max-cost-per-hour", "9"], "--max-cost-per-hour"),
                       (["--min-tokens-per-s", "0"], "--min-tokens-per-s")):
        code, _, err = run_cli(["solve", *TINY, *args])
        assert code == 2 and flag in err and "Traceback" not in err


def test_pareto_json_is_a_monotone_list(run_cli, tmp_path):
    code, stdout, err = run_cli(["pareto", *TINY, "--max-points", "4", "--step", "0", "--json",
                                 "--plot", str(tmp_path / "fig")])
    assert code == 0, err
    pts = json.loads(stdout)
    assert len(pts) >= 3
    assert all(a["iteration_time_s"] < b["iteration_time_s"] for a, b in itertools.pairwise(pts))
    assert all(a["usd_per_hour"] > b["usd_per_hour"] for a, b in itertools.pairwise(pts))
    assert sorted(p.name for p in (tmp_path / "fig").iterdir()) == ["pareto.png", "pareto.svg"]
    code, stdout, _ = run_cli(["pareto", *TINY, "--measure", "energy", "--max-points", "2", "--json"])
    assert code == 0 and all(p["joules_per_token"] > 0 for p in json.loads(stdout))


def test_replan_after_losing_gpus(run_cli, tmp_path):
    plan = tmp_path / "plan.json"
    assert run_cli(["solve", *TINY, "--json", str(plan)])[0] == 0
    code, stdout, err = run_cli(["replan", str(plan), "-c", "h100-80g:1/1,a100-80g:2/2", "--json", "-"])
    assert code == 0, err
    doc = json.loads(stdout)
    r = doc["replan"]
    assert doc["status"] in ("OPTIMAL", "FEASIBLE") and r["choice"] in ("migrate", "stay")
    assert r["migration_time_s"] >= 0 and r["migration_usd"] >= 0
    if r["migration_bytes"]:
        assert r["migration_time_s"] > 0
    code, _, err = run_cli(["replan", str(plan), "-c", "h100-80g:1/1", "--max-migration", "-1"])
    assert code == 2 and "--max-migration" in err
    # the plan that was running is checked as `validate` checks it: a stage on an island its cluster lacks is refused
    doc = json.loads(plan.read_text())
    doc["plan"]["stages"][0]["island"] = "nowhere"
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    code, _, err = run_cli(["replan", str(tmp_path / "bad.json"), "-c", "h100-80g:1/1,a100-80g:2/2"])
    assert code == 2 and "gpus.island" in err and "nowhere" in err, err


def test_estimate_reports_cost_and_energy(run_cli, tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("gpus:\n  h100-80g: {spot_usd_per_gpu_hour: 2.5}\n")
    args = ["estimate", "-m", "tests/data/models/tiny-4l.yaml", "-c", "h100-80g:8", "--gbs", "8", "--seq", "2048",
            "--pp", "2", "--dp", "4", "--json"]
    code, stdout, err = run_cli([*args, "--prices", str(f), "--price", "spot"])
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["price_kind"] == "spot" and doc["usd_per_hour"] == pytest.approx(8 * 2.5)
    assert doc["usd_per_iteration"] == pytest.approx(doc["iteration_time_s"] * 20 / 3600)
    assert doc["joules_per_token"] == pytest.approx(doc["joules_per_iteration"] / (8 * 2048))
    code, _, err = run_cli([*args, "--price", "cheap"])
    assert code == 2 and "--price" in err


def test_mixed_stage_is_priced_per_replica_type():
    """A mixed stage (eq. H1) pays for each of its replica types' GPUs (eq. E1) and their power (eq. E3)."""
    from haap_milp.specs import Replica

    mixed = StagePlan(first_layer=0, num_layers=4, gpu_type="h100-80g", tp=2, dp=3,
                      replicas=(Replica(gpu_type="h100-80g", tp=2, count=1, micro_batch=3),
                                Replica(gpu_type="a100-80g", tp=1, count=2, micro_batch=1)))
    plan = Plan(model="m", stages=(mixed,), micro_batch_size=1, num_microbatches=4, global_batch_size=20,
                seq_len=1000)
    book = load_prices()
    got = economics.plan_economics(plan, _Est(8.0, [1.0]), book)
    assert got["usd_per_hour"] == pytest.approx(2 * 12.29 + 2 * 5.1207)
    p_h, p_a = 105 + (700 - 105) * 0.5, 60 + (400 - 60) * 0.5  # u = M t / T = 4 x 1 / 8 for both types
    assert got["joules_per_iteration"] == pytest.approx(8 * (2 * p_h + 2 * p_a))


THREE = "h100-80g:4/2,a100-80g:4/2,a100-40g:4/2"  # three GPU types, two nodes each
THREE_LOST = {"h100": "h100-80g:2/2,a100-80g:4/2,a100-40g:4/2", "a100-80g": "h100-80g:4/2,a100-80g:2/2,a100-40g:4/2",
              "a100-40g": "h100-80g:4/2,a100-80g:4/2,a100-40g:2/2"}


@pytest.mark.parametrize("lost", sorted(THREE_LOST))
def test_replan_after_losing_one_node_of_three_types_is_feasible_and_fast(lost):
    """Issue 16: after one node of a three-type cluster is lost, replan returns a plan that passes the checker on
    the new cluster and its migration cost, within the command's 10 s deadline (here: wall clock, loaded machine)."""
    import time

    from haap_milp import planner, replan
    from haap_milp.catalog import load_cluster, load_model
    from haap_milp.check import check_plan
    from haap_milp.deadline import Deadline
    from haap_milp.specs import SolveOptions, TrainingSpec

    m, tr = load_model("tests/data/models/tiny-4l.yaml"), TrainingSpec(global_batch_size=8, seq_len=2048)
    opts = SolveOptions(time_limit_s=10, threads=1)
    old = planner.solve(m, load_cluster(THREE), tr, opts).result.plan
    new_cluster = load_cluster(THREE_LOST[lost])
    t0 = time.perf_counter()
    r = replan.replan(old, m, tr, new_cluster, opts, load_prices(), deadline=Deadline(10.0))
    assert time.perf_counter() - t0 <= 10.0
    assert r.new.result.status.value in ("OPTIMAL", "FEASIBLE") and r.choice in ("migrate", "stay")
    assert not check_plan(r.new.result.plan, m, new_cluster, tr)
    assert r.migration is not None and r.migration.time_s >= 0 and r.migration.usd is not None
    assert (r.migration.bytes_moved > 0) == (r.migration.time_s > 0)
    if r.degraded is not None:  # the warm start: the degraded plan is a plan of the new problem
        assert not check_plan(r.degraded, m, new_cluster, tr)
        assert r.new.estimate.iteration_time_s <= r.degraded_time_s * (1 + 1e-6)


def test_encode_inverts_decode():
    """replan.encode (a Plan as an Assignment of the presolved problem) is the inverse of presolve.decode."""
    from haap_milp import planner, presolve, replan
    from haap_milp.catalog import load_cluster, load_model
    from haap_milp.specs import SolveOptions, TrainingSpec

    m, tr = load_model("tests/data/models/tiny-4l.yaml"), TrainingSpec(global_batch_size=8, seq_len=2048)
    c = load_cluster(THREE)
    ctx = planner.Context.build(m, c, tr, SolveOptions(time_limit_s=10, threads=1, mixed_stages="off"))
    out = planner.orchestrate(ctx, [("cpsat", None)]).outcomes[0]
    a = out.raw_assignment
    assert replan.encode(ctx.presolved, presolve.decode(ctx.presolved, a, m, c, tr)) == a


def test_price_kind_reaches_every_command(run_cli, tmp_path):
    """--price-kind spot (alias of --price; on-demand / on_demand / spot) prices solve, compare, pareto and
    replan with the catalog's spot numbers; the JSON field names are the same."""
    spot = load_prices(kind="spot")
    code, stdout, err = run_cli(["solve", *TINY, "--price-kind", "spot", "--json", "-"])
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["price_kind"] == "spot"
    rate = sum(n * spot.usd_per_gpu_hour(k) for k, n in economics.gpus_by_type(Plan(**doc["plan"])).items())
    assert doc["usd_per_hour"] == pytest.approx(rate)
    code, stdout, err = run_cli(["compare", *TINY, "--time-limit", "20", "--price", "spot", "--json"])
    assert code == 0, err
    assert all(v["price_kind"] == "spot" for v in json.loads(stdout).values())
    code, stdout, err = run_cli(["pareto", *TINY, "--max-points", "2", "--price-kind", "on-demand", "--json"])
    assert code == 0, err
    assert all(p["usd_per_iteration"] > 0 for p in json.loads(stdout))
    plan = tmp_path / "plan.json"
    assert run_cli(["solve", *TINY, "--json", str(plan)])[0] == 0
    code, stdout, err = run_cli(["replan", str(plan), "-c", "h100-80g:1/1,a100-80g:2/2", "--price-kind", "spot",
                                 "--json", "-"])
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["price_kind"] == "spot" and doc["replan"]["migration_usd"] is not None
    code, _, err = run_cli(["solve", *TINY, "--price-kind", "reserved"])
    assert code == 2 and "--price" in err and "Traceback" not in err


def test_pareto_summary_states_a_bound_only_when_proven(run_cli):
    """Stopped by --max-points the sweep proves each point (its time within its gap) but not the cost optimum
    (eq. F3's bound was 95 % below the best point on the README's example): the summary gives no bound then;
    a complete frontier gives eq. F2's bound, which is at most the least point's cost."""
    code, stdout, err = run_cli(["pareto", *TINY, "--max-points", "1", "--step", "0"])
    assert code == 0, err
    assert "frontier incomplete" in stdout and "proven bound" not in stdout and "each the fastest plan" in stdout
    code, stdout, err = run_cli(["pareto", *TINY, "--max-points", "12", "--step", "0"])
    assert code == 0, err
    line = " ".join(stdout.split())
    assert "frontier complete" in line and "proven bound" in line
    least = float(line.split("least $ per iteration ")[1].split(",")[0])
    bound = float(line.split("proven bound ")[1].split(" ")[0])
    assert bound <= least * (1 + 1e-3)


def test_cost_objective_with_a_time_bound_is_proven_by_the_band_search(run_cli, tmp_path):
    """`solve --objective cost --max-iteration-time T` runs the band search with eq. TX1e and proves its plan;
    a bound below the fastest plan is INFEASIBLE (exit 0, as other infeasible problems), naming the bound."""
    out = tmp_path / "plan.json"
    code, _, err = run_cli(["solve", *TINY, "--json", str(out)])
    assert code == 0, err
    fastest = json.loads(out.read_text())["iteration_time_s"]
    code, _, err = run_cli(["solve", *TINY, "--objective", "cost", "--gap", "0", "--max-iteration-time",
                            f"{fastest * 1.2:.9g}", "--json", str(out)])
    assert code == 0, err
    doc = json.loads(out.read_text())
    obj = doc["objective"]
    assert obj["search"] == "band" and obj["frontier_complete"] and doc["status"] == "OPTIMAL"
    assert obj["objective_gap"] <= 1e-5 and doc["iteration_time_s"] <= fastest * 1.2 * (1 + 1e-9)
    code, stdout, err = run_cli(["solve", *TINY, "--objective", "cost", "--max-iteration-time",
                                 f"{fastest * 0.9:.9g}"])
    line = " ".join(stdout.split())
    assert code == 0 and "INFEASIBLE" in line and "Traceback" not in err, err  # as other infeasible problems
    assert "proven: no plan within the" in line and "every plan takes at least" in line


def test_time_objective_past_its_bound_is_infeasible_only_when_proven(run_cli):
    """--objective time with --max-iteration-time below the proven optimum: INFEASIBLE with the proven bound."""
    code, stdout, err = run_cli(["solve", *TINY, "--gap", "0", "--max-iteration-time", "0.01"])
    line = " ".join(stdout.split())
    assert code == 0 and "INFEASIBLE" in line and "every plan takes at least" in line, err


def test_replan_without_time_for_the_exact_search_returns_the_warm_start(run_cli, tmp_path, monkeypatch):
    """replan.SETUP_FACTOR: with less time than the exact search's set-up, the best warm start (the degraded plan,
    re-balanced, eq. MG4) is returned with eq. B1's bound, never worse than the degraded plan; with the factor 0
    the exact search runs (the same command, a solver plan)."""
    from haap_milp import replan as rp

    plan = tmp_path / "plan.json"
    assert run_cli(["solve", *TINY, "--json", str(plan)])[0] == 0
    monkeypatch.setattr(rp, "SETUP_FACTOR", 1e9)
    code, stdout, err = run_cli(["replan", str(plan), "-c", "h100-80g:2/2,a100-80g:1/1", "--json", "-"])
    assert code == 0, err
    doc = json.loads(stdout)
    r = doc["replan"]
    assert doc["status"] == "FEASIBLE" and doc["stats"].get("exact_skipped") == 1, doc["stats"]
    assert r["degraded_iteration_time_s"] is not None
    assert r["new_iteration_time_s"] <= r["degraded_iteration_time_s"] * (1 + 1e-9)
    monkeypatch.setattr(rp, "SETUP_FACTOR", 0.0)
    code, stdout, err = run_cli(["replan", str(plan), "-c", "h100-80g:2/2,a100-80g:1/1", "--json", "-"])
    assert code == 0, err
    assert "exact_skipped" not in json.loads(stdout)["stats"]


# llama3-405b on 8 a100-40g: presolve proves that no plan fits (memory); a bf16 run on a GPU without bf16 has no
# GPU type left at all. Every objective and pareto give the binding limit the time objective gives.
NO_MEMORY = ["-m", "llama3-405b", "-c", "a100-40g:8", "--time-limit", "5"]
NO_BF16 = ["-m", "gpt3-125m", "-c", "ascend910b-64g:8", "--time-limit", "5"]


@pytest.mark.parametrize("problem, reason", [(NO_MEMORY, "memory binds"), (NO_BF16, "try --precision fp16")])
@pytest.mark.parametrize("objective", [[], ["--objective", "cost"], ["--objective", "energy"],
                                       ["--max-cost-per-hour", "1000"],
                                       ["--objective", "cost", "--max-iteration-time", "10"]])
def test_every_objective_explains_an_infeasible_problem(run_cli, tmp_path, problem, reason, objective):
    out = tmp_path / "r.json"
    code, stdout, err = run_cli(["solve", *problem, *objective, "--json", str(out)])
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["status"] == "INFEASIBLE" and reason in doc["message"], doc["message"]
    assert "no plan within  " not in " ".join(stdout.split()) + " "


@pytest.mark.parametrize("problem, reason", [(NO_MEMORY, "memory binds"), (NO_BF16, "try --precision fp16")])
def test_pareto_explains_an_infeasible_problem(run_cli, problem, reason):
    """No plan at any budget: the binding limit, not "cheaper plans may lie past the last budget"."""
    code, stdout, err = run_cli(["pareto", *problem])
    line = " ".join(stdout.split())
    assert code == 0, err
    assert "no plan at any budget: " in line and reason in line and "cheaper plans may lie" not in line, line
    code, stdout, err = run_cli(["pareto", *problem, "--json"])
    assert code == 0 and json.loads(stdout) == [] and reason in " ".join(err.split()), err


def test_ctrl_c_during_pareto_keeps_the_points_found(run_cli, monkeypatch):
    """Ctrl-C after the first point (a real SIGINT, raised once that point's solve returns): the points found so
    far are printed as JSON, stderr says interrupted, exit 130 (as solve)."""
    import signal
    import time

    from haap_milp import frontier

    real, calls = frontier.orchestrate, []

    def then_ctrl_c(*args, **kwargs):
        got = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGINT)  # handled in the main thread: run_interruptible interrupts
            dl, t0 = kwargs["deadline"], time.monotonic()
            while not dl.interrupted and time.monotonic() - t0 < 10:
                time.sleep(0.01)
        return got

    monkeypatch.setattr(frontier, "orchestrate", then_ctrl_c)
    # Python's own SIGINT handler, reinstalled: an in-process CP-SAT solve without the CLI's deadline (an earlier
    # test's) leaves SIGINT at the system default, which would end this process
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code, stdout, err = run_cli(["pareto", *TINY, "--max-points", "6", "--step", "0", "--json"])
    finally:
        signal.signal(signal.SIGINT, old)
    assert code == 130, err
    docs = json.loads(stdout)
    assert len(docs) == 1 and docs[0]["plan"] and "Traceback" not in err
    assert "interrupted: 1 frontier point(s) found so far" in " ".join(err.split())
    assert len(calls) == 1  # no point was searched after the interrupt
