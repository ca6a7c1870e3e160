"""Terminal tables and headline metrics for `solve` and `compare`."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from haap_milp.explain import bottleneck


def plan_metrics(out) -> dict:
    """Headline numbers of an outcome (None where there is no plan)."""
    r, e = out.result, out.estimate
    d = {"iteration_time_s": r.objective_s, "tokens_per_s": None, "tflops_per_gpu": None, "mfu": None,
         "peak_memory_gib": None, "compute_bound_ratio": None, "explanation": r.message}
    if e is None:
        return d
    d.update(iteration_time_s=e.iteration_time_s, tokens_per_s=e.tokens_per_s, tflops_per_gpu=e.tflops_per_gpu,
             mfu=e.mfu, peak_memory_gib=e.peak_memory_gib)
    bound = out.estimator.compute_bound() if out.estimator is not None else None
    if bound is not None and getattr(bound, "tokens_per_s", None):
        d["compute_bound_ratio"] = e.tokens_per_s / bound.tokens_per_s
    d["explanation"] = explanation(out) or r.message
    return d


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
    t = Table(title=f"{plan.model} on {plan.cluster}: {plan.pp} stages, micro-batch {plan.micro_batch_size} "
                    f"x {plan.num_microbatches} micro-batches, gbs {plan.global_batch_size}, seq {plan.seq_len}")
    for col in ("stage", "layers", "GPUs", "island", "tp", "dp", "ep", "recompute", "mbs", "time ms", "memory GiB"):
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
            gpus, tp, dp, mbs = f"{s.gpu_type} x {s.num_gpus}", str(s.tp), str(s.dp), f"{plan.stage_micro_batch(j):g}"
        t.add_row(str(j), f"{s.first_layer}-{s.last_layer - 1} ({s.num_layers})", gpus,
                  s.island, tp, dp, str(s.ep), s.recompute, mbs,
                  _fmt(s.time_s and s.time_s * 1e3, ".1f"), f"{_fmt(s.memory_gib, '.1f')}{cap}")
    return t


def _wide(console: Console) -> Console:
    """Tables stay readable when piped (rich falls back to 80 columns)."""
    return console if console.width >= 120 else Console(width=120, file=console.file, highlight=False)


def solve_report(out, console: Console) -> None:
    r = out.result
    console = _wide(console)
    if r.plan is not None:
        console.print(stage_table(out))
    m = plan_metrics(out)
    lines = [f"status      {r.status.value}   solver {r.solver}   wall {r.wall_time_s:.2f} s"]
    if r.plan is not None:
        lines.append(f"iteration   {m['iteration_time_s']:.3f} s   tokens/s {m['tokens_per_s']:,.0f}   "
                     f"TFLOP/s/GPU {m['tflops_per_gpu']:.1f}   MFU {m['mfu']:.1%}")
        if m["compute_bound_ratio"] is not None:
            lines.append(f"vs compute bound  {m['compute_bound_ratio']:.1%} of the cluster's calibrated peak throughput")
        lines.append(f"bound       {_fmt(r.bound_s, '.3f')} s   gap {_fmt(r.gap, '.2%')}   "
                     f"DP heuristic {_fmt(r.stats.get('dp_objective_s') if isinstance(r.stats.get('dp_objective_s'), float) else None, '.3f')} s")
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


def compare_table(outs: dict, console: Console) -> None:
    console = _wide(console)
    t = Table(title="exact solvers vs heuristics (same presolved problem)")
    for col in ("method", "status", "iteration s", "tokens/s", "MFU", "stages", "bound s", "gap", "wall s", "vs DP"):
        t.add_column(col, justify="left" if col in ("method", "status") else "right")
    dp = outs.get("dp")
    dp_t = dp.result.objective_s if dp is not None else None
    for name, o in outs.items():
        r, m = o.result, plan_metrics(o)
        gain = f"{(dp_t / r.objective_s - 1):+.1%}" if dp_t and r.objective_s else "-"
        t.add_row(name, r.status.value, _fmt(r.objective_s, ".3f"), _fmt(m["tokens_per_s"], ",.0f"),
                  _fmt(m["mfu"], ".1%"), str(r.plan.pp) if r.plan else "-", _fmt(r.bound_s, ".3f"),
                  _fmt(r.gap, ".2%"), f"{r.wall_time_s:.2f}", gain)
    console.print(t)
    console.print("vs DP: throughput gain over the DP heuristic (DP time / method time - 1).", highlight=False)
    pre = next((o.presolved for o in outs.values() if getattr(o, "presolved", None) is not None), None)
    lines = search_lines(pre)
    if lines:
        console.print("\n".join(lines), highlight=False, markup=False)

