"""Benchmark report: summary.md and PNG plots from the rows of results.csv.

Gap definitions (also written into summary.md and benchmarks/README.md), with T the predicted
iteration time of a plan for the same model, cluster, global batch and sequence length (so the
throughput ratio of two plans is the inverse ratio of their times):

* exact vs DP (%)      = T_dp / T_exact - 1       throughput gain of the exact plan over the DP heuristic
* exact vs uniform (%) = T_uniform / T_exact - 1  the same against the best uniform Megatron-style plan
* proven gap           = (T_exact - bound) / T_exact   how far the exact plan can at most be from optimal

"exact" is the best plan of the exact methods (cpsat, milp) at the largest time limit of the spec.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import defaultdict
from pathlib import Path

from haap_milp.bench.plots import num, write_plots
from haap_milp.bench.spec import BenchSpec
from haap_milp.methods import EXACT, LISTED

log = logging.getLogger(__name__)

GAP_DEFINITIONS = """\
- **exact vs DP (%)** = T_dp / T_exact − 1: throughput gain of the exact plan over the DP heuristic
  (AutoHAAP/Metis/Alpa family) on the same presolved problem. Positive: the exact plan is faster.
- **exact vs uniform (%)** = T_uniform / T_exact − 1: the same against the best uniform Megatron-style plan
  (one tp/dp/recompute for every stage, layers split evenly).
- **proven gap** = (T_exact − bound) / T_exact: the exact plan is at most this far from the optimum of the
  cost model (0 = proven optimal; the solvers stop at the spec's relative_gap).
- T is the predicted iteration time for the same global batch and sequence length, so throughput ratios are
  inverse time ratios. "exact" is the better of cpsat/milp at the largest time limit."""


def task_of(row: dict) -> tuple:
    return (row["model"], row["cluster"], row["gbs"], row["seq"], row["precision"])


def summarize(rows: list[dict]) -> list[dict]:
    """One record per task: best exact plan, DP, uniform, and the gains (see GAP_DEFINITIONS)."""
    by_task: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        by_task[task_of(r)].append(r)
    out = []
    for key, rs in by_task.items():
        limits = [num(r["time_limit_s"]) for r in rs if r["method"] in EXACT]
        top = max((t for t in limits if t is not None), default=None)
        exact = [r for r in rs if r["method"] in EXACT and num(r["time_limit_s"]) == top]
        with_obj = [r for r in exact if num(r["objective_s"]) is not None]
        best = min(with_obj, key=lambda r: num(r["objective_s"])) if with_obj else (exact[0] if exact else None)
        dp = next((r for r in rs if r["method"] == "dp"), None)
        uni = next((r for r in rs if r["method"] == "uniform"), None)
        t_ex = num(best["objective_s"]) if best else None
        info = next((r for r in rs if r["model_params_b"]), rs[0])  # rows of crashed runs carry no model info
        rec = {"model": key[0], "cluster": key[1], "gbs": key[2], "seq": key[3], "precision": key[4],
               "params_b": num(info["model_params_b"]), "moe": info["moe"] == "1", "gpus": num(info["cluster_gpus"]),
               "best": best, "dp": dp, "uniform": uni, "limit": top, "t_exact": t_ex,
               "gain_dp": _gain(dp, t_ex), "gain_uniform": _gain(uni, t_ex),
               "gap": num(best["gap"]) if best else None}
        out.append(rec)
    return out


def _gain(base: dict | None, t_exact: float | None) -> float | None:
    t_base = num(base["objective_s"]) if base else None
    return None if t_base is None or not t_exact else t_base / t_exact - 1


def _f(x, spec: str, none: str = "–") -> str:
    return none if x is None else format(x, spec)


def _pct(x) -> str:
    return _f(None if x is None else 100 * x, "+.1f") + ("" if x is None else " %")


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in body]


def main_table(recs: list[dict]) -> list[str]:
    """Per model x cluster: exact vs DP and vs uniform, proven gap, solve times."""
    head = ["model", "cluster", "GPUs", "gbs×seq", "exact T s", "status", "proven gap", "DP T s", "uniform T s",
            "exact vs DP", "exact vs uniform", "exact solve s", "DP solve s", "presolve s", "exact $/1M tok",
            "exact J/tok"]
    body = []
    for r in recs:
        b, d, u = r["best"], r["dp"], r["uniform"]
        body.append([r["model"], r["cluster"], _f(r["gpus"], ".0f"), f"{r['gbs']}×{r['seq']}",
                     _f(r["t_exact"], ".3f") + (f" ({b['method']})" if b and r["t_exact"] else ""),
                     b["status"] if b else "–", _f(None if r["gap"] is None else 100 * r["gap"], ".2f") +
                     ("" if r["gap"] is None else " %"),
                     _f(num(d["objective_s"]) if d else None, ".3f") + _status_note(d),
                     _f(num(u["objective_s"]) if u else None, ".3f") + _status_note(u),
                     _pct(r["gain_dp"]), _pct(r["gain_uniform"]), _f(num(b["wall_s"]) if b else None, ".2f"),
                     _f(num(d["wall_s"]) if d else None, ".2f"), _f(num((b or d or {}).get("presolve_s")), ".2f"),
                     _f(num(b.get("usd_per_million_tokens", "")) if b else None, ".4g"),  # eqs. E2, E5
                     _f(num(b.get("joules_per_token", "")) if b else None, ".4g")])
    return _table(head, body)


def _status_note(r: dict | None) -> str:
    if r is None or r["status"] in ("OPTIMAL", "FEASIBLE"):
        return ""
    return f" {r['status']}"


def method_table(rows: list[dict]) -> list[str]:
    """Per method and time limit: status counts, solve times, gaps."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["method"], r["time_limit_s"])].append(r)
    head = ["method", "limit s", "runs", "OPTIMAL", "FEASIBLE", "INFEASIBLE", "NO_SOLUTION", "ERROR",
            "median solve s", "max solve s", "median gap", "max gap"]
    body = []
    order = {m: i for i, m in enumerate(LISTED)}
    for (m, lim), rs in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 9), num(kv[0][1]) or 0)):
        walls = [w for w in (num(r["wall_s"]) for r in rs) if w is not None]
        gaps = [g for g in (num(r["gap"]) for r in rs) if g is not None]
        counts = [sum(r["status"] == s for r in rs) for s in ("OPTIMAL", "FEASIBLE", "INFEASIBLE", "NO_SOLUTION",
                                                             "ERROR")]
        body.append([m, lim or "–", len(rs), *counts,
                     _f(statistics.median(walls) if walls else None, ".2f"), _f(max(walls, default=None), ".2f"),
                     _f(statistics.median(gaps) * 100 if gaps else None, ".2f"),
                     _f(max(gaps) * 100 if gaps else None, ".2f")])
    return _table(head, body)


def detail_table(rows: list[dict]) -> list[str]:
    """Every exact run: status, objective, gap and solve time per time limit."""
    head = ["model", "cluster", "method", "limit s", "status", "T s", "bound s", "gap", "solve s", "message"]
    body = [[r["model"], r["cluster"], r["method"], r["time_limit_s"], r["status"], _f(num(r["objective_s"]), ".3f"),
             _f(num(r["bound_s"]), ".3f"), _f(None if num(r["gap"]) is None else 100 * num(r["gap"]), ".2f"),
             _f(num(r["wall_s"]), ".2f"), (r["message"] or "")[:120].replace("|", "/")]
            for r in rows if r["method"] in EXACT]
    return _table(head, body)


def verdict(recs: list[dict]) -> list[str]:
    """Counts of where the exact plan wins, ties and loses against each baseline."""
    lines = []
    for name, key in (("DP", "gain_dp"), ("uniform", "gain_uniform")):
        gains = [r[key] for r in recs if r[key] is not None]
        if not gains:
            continue
        win = sum(g > 0.01 for g in gains)
        tie = sum(-0.001 <= g <= 0.01 for g in gains)
        lose = sum(g < -0.001 for g in gains)
        geo = math.exp(statistics.fmean(math.log1p(g) for g in gains)) - 1 if all(g > -1 for g in gains) else None
        lines.append(f"- exact vs {name}: {len(gains)} comparable tasks; exact faster by > 1 % in {win}, within 1 % "
                     f"in {tie}, slower in {lose} (only possible when a time limit stopped the exact solver "
                     f"before it matched its warm start); geometric-mean gain {_pct(geo)}, "
                     f"largest {_pct(max(gains))}.")
    no_exact = [r for r in recs if r["t_exact"] is None]
    if no_exact:
        lines.append(f"- no exact plan in {len(no_exact)} task(s): " + "; ".join(
            f"{r['model']} on {r['cluster']} ({r['best']['status'] if r['best'] else 'not run'})"
            for r in no_exact[:12]) + ("; …" if len(no_exact) > 12 else ""))
    return lines


def environment() -> str:
    """Where the numbers were measured (they depend on the machine and the solver versions)."""
    import datetime
    import os
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def ver(pkg: str) -> str:
        try:
            return version(pkg)
        except PackageNotFoundError:
            return "?"

    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (f"_Written {when} on {os.cpu_count()} CPU(s), Python {platform.python_version()}, "
            f"OR-Tools {ver('ortools')}, HiGHS {ver('highspy')}, haap-milp {ver('haap-milp')}._")


def grid_order(spec: BenchSpec, rows: list[dict]) -> list[dict]:
    """Rows in the spec's grid order (they arrive in completion order), methods in run order."""
    tasks = {(t.model, t.cluster, str(t.gbs), str(t.seq), t.precision): i for i, t in enumerate(spec.tasks())}
    runs = {(m, "" if t is None else format(float(t), "g")): i for i, (m, t) in enumerate(spec.runs())}
    return sorted(rows, key=lambda r: (tasks.get(task_of(r), len(tasks)), runs.get((r["method"], r["time_limit_s"]),
                                                                                    len(runs))))


def write_summary(spec: BenchSpec, rows: list[dict], path: Path) -> Path:
    rows = grid_order(spec, rows)
    recs = summarize(rows)
    lines = [f"# Benchmark `{spec.name}`", ""]
    if spec.description:
        lines += [spec.description.strip(), ""]
    limits = ", ".join(format(t, "g") for t in spec.time_limits_s)
    lines.append(f"{len(rows)} runs, {len(recs)} tasks (model × cluster × gbs × seq); methods "
                 f"{', '.join(spec.methods)}; exact time limits {limits} s; {spec.threads} solver thread(s) per run; "
                 f"stop at relative gap {spec.relative_gap:g}; target {spec.target}.")
    lines += ["", "## Definitions", "", GAP_DEFINITIONS, "", "## Verdict", ""]
    lines += verdict(recs) or ["- no task has both an exact and a baseline plan."]
    lines += ["", "## Exact vs heuristics (largest time limit)", ""] + main_table(recs)
    lines += ["", "## Per method and time limit", ""] + method_table(rows)
    lines += ["", "## Exact runs", ""] + detail_table(rows) + ["", environment(), ""]
    path.write_text("\n".join(lines))
    return path


def write_report(spec: BenchSpec, rows: list[dict], out_dir: Path) -> list[Path]:
    """summary.md and the PNG plots; returns the paths written."""
    paths = [write_summary(spec, rows, out_dir / "summary.md")]
    try:
        paths += write_plots(rows, summarize(rows), out_dir)
    except Exception:
        log.exception("bench plots failed")
    return paths
