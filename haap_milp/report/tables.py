"""Terminal tables and headline metrics for `solve` and `compare`."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from haap_milp.explain import bottleneck


def plan_metrics(out, prices=None) -> dict:
    """Headline numbers of an outcome (None where there is no plan): time, throughput, and the cost and energy
    of eqs. E1-E5 (``economics.plan_economics``; ``prices``: a ``PriceBook``, default the catalog's on-demand)."""
    from haap_milp.catalog.prices import load_prices
    from haap_milp.economics import plan_economics

    r, e = out.result, out.estimate
    d = {"iteration_time_s": r.objective_s, "tokens_per_s": None, "tflops_per_gpu": None, "mfu": None,
         "peak_memory_gib": None, "compute_bound_ratio": None, "explanation": r.message}
    d.update(plan_economics(r.plan, e, prices or load_prices()))
    d["gpu_pool"] = gpu_pool(out)
    d["sensitivity"] = None
    if e is None:
        return d
    if out.presolved is not None and out.raw_assignment is not None:
        from haap_milp.robust import sensitivity

        d["sensitivity"] = sensitivity(out.presolved.problem, out.raw_assignment)
    d.update(iteration_time_s=e.iteration_time_s, tokens_per_s=e.tokens_per_s, tflops_per_gpu=e.tflops_per_gpu,
             mfu=e.mfu, peak_memory_gib=e.peak_memory_gib)
    bound = out.estimator.compute_bound() if out.estimator is not None else None
    if bound is not None and getattr(bound, "tokens_per_s", None):
        d["compute_bound_ratio"] = e.tokens_per_s / bound.tokens_per_s
    d["explanation"] = explanation(out) or r.message
    return d


def gpu_pool(out) -> dict | None:
    """The cluster as a pool (eq. G1 is <=): GPUs per type the plan uses, and how many there are."""
    est = out.estimator
    if est is None:
        return None
    pool = {}
    for ng in est.cluster.node_groups:
        row = pool.setdefault(ng.gpu.name, {"used": 0, "available": 0})
        row["available"] += ng.num_gpus
    plan = out.result.plan
    from haap_milp.economics import gpus_by_type

    for k, n in (gpus_by_type(plan) if plan is not None else {}).items():
        pool.setdefault(k, {"used": 0, "available": 0})["used"] += n  # a mixed stage: per replica type
    return pool


def economics_lines(m: dict) -> list[str]:
    """Cost, energy, pool and sensitivity lines of the report (eqs. E1-E5, R4)."""
    lines = []
    kind = m.get("price_kind", "on_demand")
    if m.get("usd_per_iteration") is not None:
        lines.append(f"cost        ${m['usd_per_hour']:,.2f}/h of GPUs used   ${m['usd_per_iteration']:.4g} per iteration"
                     f"   ${m['usd_per_million_tokens']:.4g} per 1M tokens   ({kind} prices)")
    elif m.get("gpu_pool"):
        lines.append(f"cost        - (a GPU type has no {kind} price; give one with --prices FILE)")
    if m.get("joules_per_token") is not None:
        lines.append(f"energy      {m['average_power_w'] / 1e3:,.1f} kW average   {m['joules_per_token']:.4g} J per token"
                     "   (board power: idle + (TDP - idle) x compute-busy share)")
    if m.get("gpu_pool"):
        lines.append("pool        " + ", ".join(f"{t} {r['used']}/{r['available']}" for t, r in m["gpu_pool"].items())
                     + " GPUs used/available")
    sens = m.get("sensitivity")
    if sens:
        from haap_milp.robust import most_sensitive

        top = most_sensitive(sens)
        lines.append(f"sensitivity +1 % on stage {top['stage']}'s time moves T by {top['elasticity']:+.2f} % (the most; "
                     "per stage in --json)")
    return lines


def explanation(out) -> str:
    """Bottleneck sentence for a plan found by a solver."""
    pre, plan = out.presolved, out.result.plan
    if pre is None or plan is None or out.raw_assignment is None:
        return ""
    return bottleneck(pre.problem, out.raw_assignment, pre.problem.groups)


def _fmt(x, spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


def stage_table(out) -> Table:
    plan, est = out.result.plan, out.estimate
    inter = f" x {plan.vpp} interleaved chunks" if plan.vpp > 1 else ""  # eqs. I1-I5
    t = Table(title=f"{plan.model} on {plan.cluster}: {plan.pp} stages{inter}, micro-batch {plan.micro_batch_size} "
                    f"x {plan.num_microbatches} micro-batches, gbs {plan.global_batch_size}, seq {plan.seq_len}"
                    + (f", context-parallel {plan.cp}" if plan.cp > 1 else ""))
    zero = any(s.zero is not None for s in plan.stages)  # a searched ZeRO stage (eq. Z1): one more column
    for col in ("stage", "layers", "GPUs", "island", "tp", "dp", "ep", "recompute", *(("zero",) if zero else ()),
                "mbs", "time ms", "memory GiB"):
        t.add_column(col, justify="right" if col not in ("GPUs", "island", "recompute") else "left")
    for j, s in enumerate(plan.stages):
        e = est.stages[j] if est is not None else None
        cap = f" / {e.capacity_gib:.1f}" if e is not None else ""
        if s.replicas:  # a mixed stage (eq. H1): one line per replica type, "count x tp" and samples each
            gpus = " + ".join(f"{r.gpu_type} x {r.tp * r.count}" for r in s.replicas)
            tp = "/".join(str(r.tp) for r in s.replicas)
            dp = "+".join(str(r.count) for r in s.replicas)
            mbs = "/".join(str(r.micro_batch) for r in s.replicas)
        else:
            gpus, tp, dp, mbs = f"{s.gpu_type} x {s.num_gpus * plan.cp}", str(s.tp), str(s.dp), f"{plan.stage_micro_batch(j):g}"
        t.add_row(str(j), f"{s.first_layer}-{s.last_layer - 1} ({s.num_layers})", gpus,
                  s.island, tp, dp, str(s.ep) + (f" etp {s.etp}" if s.etp > 1 else ""), s.recompute, *((_fmt(s.zero, "d"),) if zero else ()), mbs,
                  _fmt(s.time_s and s.time_s * 1e3, ".1f"), f"{_fmt(s.memory_gib, '.1f')}{cap}")
    return t


def _wide(console: Console) -> Console:
    """Tables stay readable when piped (rich falls back to 80 columns)."""
    return console if console.width >= 120 else Console(width=120, file=console.file, highlight=False)


def solve_report(out, console: Console, prices=None, objective: dict | None = None, metrics: dict | None = None) -> None:
    """``metrics``: ``plan_metrics(out, prices)`` when the caller has it already (not computed twice)."""
    r = out.result
    console = _wide(console)
    if r.plan is not None:
        console.print(stage_table(out))
    m = metrics if metrics is not None else plan_metrics(out, prices)
    lines = [f"status      {r.status.value}   solver {r.solver}   wall {r.wall_time_s:.2f} s"]
    if r.plan is not None:
        lines.append(f"iteration   {m['iteration_time_s']:.3f} s   tokens/s {m['tokens_per_s']:,.0f}   "
                     f"TFLOP/s/GPU {m['tflops_per_gpu']:.1f}   MFU {m['mfu']:.1%}")
        if m["compute_bound_ratio"] is not None:
            lines.append(f"vs compute bound  {m['compute_bound_ratio']:.1%} of the cluster's calibrated peak throughput")
        lines.append(f"bound       {_fmt(r.bound_s, '.3f')} s   gap {_fmt(r.gap, '.2%')}   "
                     f"DP heuristic {_fmt(r.stats.get('dp_objective_s') if isinstance(r.stats.get('dp_objective_s'), float) else None, '.3f')} s")
    if r.plan is not None:
        lines += economics_lines(m)
    lines += objective_lines(objective)
    s = r.stats
    lines.append(f"presolve    {s.get('options_enumerated', '-')} options -> {s.get('options_kept', '-')} kept, "
                 f"{s.get('variants_kept', '-')} micro-batch variants, <= {s.get('max_stages', '-')} stages, "
                 f"{s.get('presolve_s', 0):.2f} s")
    lines += search_lines(out.presolved)
    if m.get("explanation"):
        lines.append(f"why         {m['explanation']}")
    if r.message and r.message != m.get("explanation"):
        lines.append(f"note        {r.message}")
    for v in out.violations:
        lines.append(f"VIOLATION   {v}")
    console.print("\n".join(lines), highlight=False, markup=False)


def objective_lines(doc: dict | None) -> list[str]:
    """What --objective / --robust did (objectives.plan_for's block)."""
    if not doc or doc.get("objective") == "time" and "robust_pct" not in doc and "points_searched" not in doc:
        return []
    if "robust_pct" in doc:
        if "worst_case_iteration_time_s" not in doc:
            return []
        nom = doc.get("nominal_plan_worst_case_s")
        return [f"robust      worst case {doc['worst_case_iteration_time_s']:.3f} s at +{doc['robust_pct']:g} % compute"
                + (f"; the nominal plan's worst case {nom:.3f} s" if nom is not None else "")]
    unit = {"cost": ("usd_per_iteration", "$", ".4g"), "energy": ("joules_per_iteration", "J ", ",.4g")}
    if doc.get("search") == "band":  # eqs. EB1-EB5
        head = f"objective   {doc['objective']}: {doc['points_searched']} plan(s) kept, " + \
            ("proven" if doc.get("frontier_complete") else "not proven") + f" ({doc.get('stopped', '')})"
    else:
        head = f"objective   {doc['objective']}: {doc['points_searched']} frontier point(s), " + \
            ("complete" if doc.get("frontier_complete") else "incomplete") + f" ({doc.get('stopped', '')})"
    if doc["objective"] in unit and unit[doc["objective"]][0] in doc:  # (no plan: the status line says why)
        key, sym, fmt = unit[doc["objective"]]
        lb, gap = doc.get(f"{key}_lower_bound"), doc.get("objective_gap")
        head += f"; best {sym}{format(doc[key], fmt)} per iteration, bound {'-' if lb is None else sym + format(lb, fmt)}" \
                f", gap {'-' if gap is None else format(gap, '.2%')}"
    return [head]


def search_lines(pre) -> list[str]:
    """What presolve left out (GPUs, profile points) and how a profile prices each GPU type: nothing is
    dropped without a line here (presolve.Excluded)."""
    if pre is None:
        return []
    lines = [f"excluded    {e}" for e in pre.excluded]
    lines += [f"unmeasured  {e}" for e in pre.analytic]
    if pre.profile is not None:
        lines.append(f"profile     fallback {pre.profile['fallback']}; " + "; ".join(
            f"{t}: {how}" for t, how in pre.profile["gpu_types"].items()))
    return lines


def compare_table(outs: dict, console: Console, prices=None) -> None:
    console = _wide(console)
    t = Table(title="exact solvers vs heuristics (same presolved problem)")
    for col in ("method", "status", "iteration s", "tokens/s", "MFU", "$/1M tok", "J/tok", "stages", "bound s", "gap",
                "wall s", "vs DP"):
        t.add_column(col, justify="left" if col in ("method", "status") else "right")
    dp = outs.get("dp")
    dp_t = dp.result.objective_s if dp is not None else None
    for name, o in outs.items():
        r, m = o.result, plan_metrics(o, prices)
        gain = f"{(dp_t / r.objective_s - 1):+.1%}" if dp_t and r.objective_s else "-"
        t.add_row(name, r.status.value, _fmt(r.objective_s, ".3f"), _fmt(m["tokens_per_s"], ",.0f"),
                  _fmt(m["mfu"], ".1%"), _fmt(m["usd_per_million_tokens"], ".4g"), _fmt(m["joules_per_token"], ".4g"),
                  str(r.plan.pp) if r.plan else "-", _fmt(r.bound_s, ".3f"),
                  _fmt(r.gap, ".2%"), f"{r.wall_time_s:.2f}", gain)
    console.print(t)
    console.print("vs DP: throughput gain over the DP heuristic (DP time / method time - 1).", highlight=False)
    pre = next((o.presolved for o in outs.values() if getattr(o, "presolved", None) is not None), None)
    lines = search_lines(pre)
    if lines:
        console.print("\n".join(lines), highlight=False, markup=False)

