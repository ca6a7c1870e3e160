"""Shared by every solver (and only this package may be shared between solver modules):
slot tables, bounds, the solver-neutral linear model, warm-start canonicalisation, and the
per-variant driver. Equation labels: formulations/README.md."""

from haap_milp.solvers.common.bounds import VariantBound, coverage_at, infeasibility_reason, variant_bound
from haap_milp.solvers.common.branch_and_bound import VariantResult, run_variants
from haap_milp.solvers.common.hints import canonical, replace_dominated, sort_runs
from haap_milp.solvers.common.model import LinModel, build_model, decode, hint_values
from haap_milp.solvers.common.slot_bounds import MEM_RTOL, Tables, build_tables, max_layers_mem, usable_options

__all__ = [
    "MEM_RTOL", "LinModel", "Tables", "VariantBound", "VariantResult", "build_model", "build_tables", "canonical",
    "coverage_at", "decode", "hint_values", "infeasibility_reason", "max_layers_mem", "replace_dominated",
    "run_variants", "sort_runs", "usable_options", "variant_bound",
]
