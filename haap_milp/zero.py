"""The ZeRO stage as a search dimension (formulations/README.md eq. Z1): which stages presolve may give a stage
option, and the rule the checker enforces on a plan. Pricing lives in estimator/zero.py and costs.param_sync.

The set is the runtime's (estimator/runtime.py ``zero_stages``: what Megatron-Core, DeepSpeed's
PipelineEngine or FSDP can run) intersected with the target engine's (targets.EngineCapabilities
``zero_allowed``: what haap can emit for it, which for torchtitan depends on whether the plan pipelines).
"""

from __future__ import annotations

from haap_milp.errors import HaapInputError
from haap_milp.estimator.runtime import resolve, zero_stages
from haap_milp.specs import Plan, TrainingSpec, Violation
from haap_milp.targets import EngineCapabilities


def runtime_zero(training: TrainingSpec) -> int:
    """The runtime's own ZeRO stage (the stage of an option whose ``zero`` is None)."""
    return resolve(training).zero_stage


def default_zero(asked, training: TrainingSpec):
    """Eq. D3: ``--zero`` left unset ("default") searches the ZeRO stage (auto) under the fsdp runtime when the
    user fixed no stage (``zero_stage`` None), and keeps the runtime's one stage (None) elsewhere. Why: an
    FSDP-only runtime (torchtitan, PyTorch FSDP) runs ZeRO-3 per micro-batch by default, which re-gathers the
    weights every micro-batch; the search picks ZeRO-1/2 where memory allows and ZeRO-3 where it must, and
    measured up to +9.4 % (llama2-13b on 16 A100-40GB, torchtitan) and +0.5-6.4 % on most fsdp rows of
    benchmarks/results/search_dimensions.md. Under megatron (ZeRO 0/1) the search measured no gain anywhere:
    ZeRO-0's all-reduce moves the same bytes as ZeRO-1, so it only adds solve time. Other ``asked`` values are
    returned unchanged."""
    if asked != "default":
        return asked
    return "auto" if training.engine == "fsdp" and training.zero_stage is None else None


def search_set(asked, training: TrainingSpec, caps: EngineCapabilities, single_stage: bool) -> tuple[int | None, ...]:
    """Eq. Z1: the ZeRO stages presolve enumerates per option. ``asked`` None: (None,), the runtime's stage only
    (no search; every price as before); "auto": every stage the runtime and the target run; a tuple: those,
    each of which must be runnable (else the user's error, naming why); "default": eq. D3 (``default_zero``)."""
    asked = default_zero(asked, training)
    if asked is None:
        return (None,)
    runnable = tuple(z for z in zero_stages(training.engine) if z in caps.zero_allowed(single_stage))
    if not caps.zero_per_stage:
        if asked == "auto":
            return (None,)
        raise HaapInputError(f"--zero {','.join(map(str, asked))}: {caps.zero_why}.", field="--zero",
                             value=",".join(map(str, asked)))
    if asked == "auto":
        return runnable or (None,)
    bad = [z for z in asked if z not in runnable]
    if bad:
        why = (f"the {training.engine} runtime runs ZeRO {', '.join(map(str, zero_stages(training.engine)))}"
               f"; target {caps.name} runs {', '.join(map(str, caps.zero_allowed(single_stage)))}"
               + (f" ({caps.zero_why})" if caps.zero_why else ""))
        raise HaapInputError(f"--zero {','.join(map(str, asked))}: ZeRO {', '.join(map(str, bad))} cannot run here: "
                             f"{why}. Use --zero auto or one of {', '.join(map(str, runnable)) or 'none'}.",
                             field="--zero", value=",".join(map(str, asked)))
    return tuple(dict.fromkeys(asked))


def stage_zero(plan: Plan, j: int, training: TrainingSpec) -> int:
    """The ZeRO stage stage ``j`` runs: its own, else the runtime's."""
    z = plan.stages[j].zero
    return runtime_zero(training) if z is None else z


def plan_violations(plan: Plan, training: TrainingSpec, caps: EngineCapabilities) -> list[Violation]:
    """Rule ``target.zero``: every explicit stage ZeRO stage is one the runtime and the target run (eq. Z1); a
    mixed stage runs the runtime's stage."""
    out = []
    allowed = set(zero_stages(training.engine)) & set(caps.zero_allowed(plan.pp == 1))
    if not caps.zero_per_stage and len({stage_zero(plan, j, training) for j in range(plan.pp)}) > 1:
        out.append(Violation("target.zero", None, f"stages differ in ZeRO stage: {caps.zero_why}"))
    for j, s in enumerate(plan.stages):
        if s.zero is None:
            continue
        if s.zero not in allowed:
            out.append(Violation("target.zero", j, f"ZeRO {s.zero} cannot run here: the {training.engine} runtime and "
                                 f"target {caps.name} run {sorted(allowed)}" + (f" ({caps.zero_why})" if caps.zero_why
                                                                               else "")))
    return out


def drop_outclassed_stages(opts, allowed, coef: dict, keys: tuple[str, ...]):
    """Under a uniform engine (eq. U1 with z in the signature) presolve's outclassing compares options of one
    signature only, so a ZeRO stage that is worse everywhere would double the search. This drops a whole family
    (tp, dp, recompute, ep, z') when in every group where it has an allowed option the same family at another
    stage z has an allowed option no worse in every coefficient (``keys`` of ``coef``, presolve's) and better in
    one: any uniform plan on z' then has a no worse twin on z on the same GPUs (same usage, endpoints, budget).
    ``allowed`` is returned with those options cleared (a new array)."""
    import numpy as np

    out = np.asarray(allowed).copy()
    fam: dict[tuple, dict[tuple, int]] = {}  # (tp, dp, recompute, ep, zero) -> {(group, ...): option}
    for i in np.flatnonzero(out).tolist():
        o = opts[i]
        if o.mix or o.zero is None:
            continue
        fam.setdefault((o.tp, o.dp, o.recompute, o.ep, o.zero), {})[(o.group,)] = i
    vec = lambda i: np.array([float(coef[k][i]) for k in keys])
    for key, members in fam.items():
        for other_z in (0, 1, 2, 3):
            twin = fam.get((*key[:4], other_z))
            if other_z == key[4] or twin is None or not set(members) <= set(twin):
                continue
            better = [(vec(twin[g]) <= vec(i)).all() and (vec(twin[g]) < vec(i)).any() for g, i in members.items()]
            if all(better):
                out[list(members.values())] = False
                break
    return out
