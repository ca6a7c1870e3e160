"""``Problem`` <-> plain JSON (every array written out), for the pinned reference instances in
formulations/instances/problems/. Only ``haap_milp.problem`` is used: nothing here depends on the
estimator or calibration.json, so a pinned instance's optimum moves only if the semantics of
``problem.evaluate``/``violations`` change."""

from __future__ import annotations

import itertools
import json
import pathlib

import numpy as np

from haap_milp.problem import Assignment, Option, Problem, Stage, Variant, evaluate, violations

ARRAYS = ("layer_time", "first_time", "last_time", "layer_static_mem", "layer_act_mem", "first_static_mem",
          "first_act_mem", "last_static_mem", "last_act_mem", "fixed_mem", "mem_capacity", "sync_fixed",
          "sync_per_layer", "sync_first", "sync_last")
PINNED = pathlib.Path(__file__).parent.parent / "formulations" / "instances" / "problems"


def problem_to_dict(p: Problem) -> dict:
    return {
        "num_layers": p.num_layers, "max_stages": p.max_stages, "groups": list(p.groups),
        "group_capacity": list(p.group_capacity), "uniform": p.uniform, "same_tp_first_last": p.same_tp_first_last,
        "options": [[o.group, o.tp, o.dp, o.ep, o.recompute] for o in p.options],
        "variants": [{"samples_per_microbatch": v.samples_per_microbatch, "num_microbatches": v.num_microbatches,
                      **{k: [float(x) for x in getattr(v, k)] for k in ARRAYS},
                      "p2p_time": [[float(x) for x in row] for row in v.p2p_time],
                      "allowed": [bool(x) for x in v.allowed]} for v in p.variants],
    }


def problem_from_dict(d: dict) -> Problem:
    variants = tuple(Variant(
        samples_per_microbatch=v["samples_per_microbatch"], num_microbatches=v["num_microbatches"],
        **{k: np.asarray(v[k], dtype=float) for k in ARRAYS},
        p2p_time=np.asarray(v["p2p_time"], dtype=float), allowed=np.asarray(v["allowed"], dtype=bool),
    ) for v in d["variants"])
    return Problem(num_layers=d["num_layers"], max_stages=d["max_stages"], groups=tuple(d["groups"]),
                   group_capacity=tuple(d["group_capacity"]),
                   options=tuple(Option(g, tp, dp, ep, rc) for g, tp, dp, ep, rc in d["options"]),
                   variants=variants, uniform=d["uniform"], same_tp_first_last=d["same_tp_first_last"])


def assignment_to_dict(a: Assignment | None) -> dict | None:
    return None if a is None else {"variant": a.variant, "stages": [[s.option, s.num_layers] for s in a.stages]}


def assignment_from_dict(d: dict | None) -> Assignment | None:
    return None if d is None else Assignment(d["variant"], tuple(Stage(o, n) for o, n in d["stages"]))


def load_pinned(path: pathlib.Path) -> tuple[Problem, dict]:
    doc = json.loads(path.read_text())
    return problem_from_dict(doc["problem"]), doc


def even_split_uniform_optimum(p: Problem) -> float | None:
    """Brute force over the uniform baseline's search space (formulations/README.md, "Uniform
    baseline"): one (tp, dp, recompute) signature on every stage, P dividing L with L/P layers per
    stage, and *any* GPU group per stage (every interleaving, not only groups filled in order).
    Independent of solvers/uniform.py; returns the best objective or None."""
    best = None
    for vi, var in enumerate(p.variants):
        ok = [i for i in range(p.num_options) if var.allowed[i]]
        for sig in {p.options[i].signature for i in ok}:
            mine = [i for i in ok if p.options[i].signature == sig]
            for n_st in range(1, min(p.max_stages, p.num_layers) + 1):
                if p.num_layers % n_st:
                    continue
                for combo in itertools.product(mine, repeat=n_st):
                    a = Assignment(vi, tuple(Stage(o, p.num_layers // n_st) for o in combo))
                    if violations(p, a):
                        continue
                    t = evaluate(p, a)
                    best = t if best is None or t < best else best
    return best
