"""Fit the estimator's efficiency parameters per GPU type on published measured runs.

    .venv/bin/python benchmarks/calibrate.py [--out haap_milp/estimator/calibration.json]

Data: benchmarks/data/measured_runs.json (a copy of the project's reference file, every source field
kept). Rows are mapped by ``measured_runs`` (assumptions listed per row). Fit rows =
complete rows not in HOLDOUT. Objective: sum of squared log errors of the iteration time (the metric
each source reports, converted as measured.py states), minimised by Nelder-Mead in blocks
(globals, then each GPU family), 4 rounds. Parameters:

* per family (Ampere: a100-80g + a100-40g rows, one shared set; Hopper: h100-80g): asymptotic GEMM
  efficiency at 16-bit (and fp8 on Hopper), flash-attention efficiency,
  MoE per-layer fixed cost, per-local-expert launch cost, fp8 cost per routed token-expert pair, grouped-GEMM
  efficiency and its expert-shape half point (tokens per expert) (Hopper, the only family with MoE rows);
* global: hidden fractions of TP, DP and EP communication, the slow-down of compute under an overlapped FSDP
  collective (eq. Z4b), and the per-kernel fixed cost (one value for all GPU families: a property of the launch
  path and cuBLAS, not of the silicon generation);
* memory (closed-form least squares, measured_runs.fit_frag_fraction): the allocator fragmentation as a
  share of the largest allocation, on the torchtitan peak-memory rows that map onto haap's recomputation.

Everything else (HBM / NVLink / NIC efficiencies, latencies, memory overhead) is a stated prior
(calibration.PRIOR_SOURCES). GPU types without rows are derived at run time (calibration.derive_params).
Writes the parameters, the rows used, their roles and residuals.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measured_runs import error_pct, estimator_for, fit_frag_fraction, load_rows, memory_cases, predict_time_s, to_run

from haap_milp.catalog.data import gpu_entry
from haap_milp.estimator.calibration import (
    PRIOR_SOURCES,
    Calibration,
    GpuParams,
    load_calibration,
    machine_balance,
    to_dict,
)

DATA = ROOT / "benchmarks" / "data" / "measured_runs.json"
OUT = ROOT / "haap_milp" / "estimator" / "calibration.json"

# Held out from the fit (about a quarter of the complete rows, spread over sources, sizes and precisions).
HOLDOUT = (
    "sc21_gpt_18B", "torchtitan_a100_llama2_13b_noac", "llmfoundry_a100_mpt13b_seq2048_8gpu",
    "llmfoundry_a10040_mpt13b_seq2048_128gpu", "dgxc_llama31_70b_bf16_2048", "dgxc_nemotron4_15b_bf16_16",
    "dgxc_gpt3_175b_bf16_128", "nemo2407_h100_fp8_LLAMA2-13B", "mb2511_h100_llama3_70b_fp8_64",
    "llmfoundry_h100_mpt30b_seq2048_32gpu", "dgxc_grok1_314b_bf16_1024_nemo2411", "modelzoo_qwen3_235b_h100_bf16_d",
)
# Complete rows kept out of every fit (still predicted and reported), with the reason.
OUTLIERS: dict[str, str] = {}  # none: the Qwen3-30B-A3B fp8 rows (once kept out) are priced by the per-expert term
# (calibration.GpuParams.expert_latency_s) and fitted like every other row
FAMILIES = {"ampere": ("a100-80g", "a100-40g"), "hopper": ("h100-80g",)}
# (name, low, high): box constraints of each fitted parameter. The per-kernel fixed cost is kept at or below
# 15 us (CUDA launch ~3-5 us + prologue/epilogue + tail wave; beyond that it would stand in for other effects).
GPU_FIT = {
    "ampere": [("gemm_eff_16", 0.4, 0.95), ("attn_eff", 0.2, 0.9)],
    "hopper": [("gemm_eff_16", 0.4, 0.95), ("gemm_eff_fp8", 0.2, 0.95), ("attn_eff", 0.2, 0.9),
               ("grouped_gemm_eff", 0.2, 1.0), ("moe_latency_s", 0.0, 1e-3),
               ("grouped_m_half", 0.0, 4096.0), ("expert_latency_s", 0.0, 200e-6),
               ("fp8_pair_s", 0.0, 1e-6)],
}
GLOBAL_FIT = [("tp_overlap", 0.0, 0.9), ("dp_overlap", 0.0, 0.95), ("ep_overlap", 0.0, 0.9),
              ("overlap_slowdown", 0.0, 1.0)]
# GPU parameters fitted as one value for every family, in the globals block: the per-kernel fixed cost (CUDA launch +
# cuBLAS prologue/epilogue + tail wave) is a property of the software path, alike on A100 and H100. Fitted per family,
# the Hopper block traded it against the per-expert cost (expert_latency_s) and sent it to its lower bound, leaving
# small dense GEMMs almost as efficient as large ones (tests/test_estimator_time.py).
SHARED_GPU_FIT = [("kernel_latency_s", 1e-6, 15e-6)]


def nelder_mead(f, x0: list[float], step: list[float], iters: int = 200, tol: float = 1e-7) -> list[float]:
    """Plain Nelder-Mead (Nelder & Mead 1965; standard coefficients 1, 2, 0.5, 0.5)."""
    pts = [list(x0)] + [[x + (step[i] if j == i else 0.0) for j, x in enumerate(x0)] for i in range(len(x0))]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = sorted(range(len(pts)), key=vals.__getitem__)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < tol:
            break
        cen = [sum(p[i] for p in pts[:-1]) / (len(pts) - 1) for i in range(len(x0))]
        refl = [c + (c - w) for c, w in zip(cen, pts[-1])]
        fr = f(refl)
        if fr < vals[0]:
            exp = [c + 2 * (r - c) for c, r in zip(cen, refl)]
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = [c + 0.5 * (w - c) for c, w in zip(cen, pts[-1])]
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:
                pts = [pts[0]] + [[b + 0.5 * (p - b) for b, p in zip(pts[0], q)] for q in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    return pts[min(range(len(pts)), key=vals.__getitem__)]


def _clip(x: float, lo: float, hi: float) -> float:
    return min(hi, max(lo, x))


class Fit:
    """Holds the rows and the current calibration; evaluates the loss of a parameter block."""

    def __init__(self, rows, exclude=HOLDOUT, runs=None):
        self.runs = runs if runs is not None else [to_run(x) for x in rows]
        self.exclude = set(exclude) | set(OUTLIERS)
        self.cal = Calibration(gpus={g: GpuParams(source="fitted") for fam in FAMILIES.values() for g in fam})

    def predictions(self, cal: Calibration, runs) -> list[float]:
        return [predict_time_s(r, estimator_for(r, cal)) for r in runs]

    def fit_runs(self, family: str | None = None):
        gpus = FAMILIES[family] if family else tuple(g for f in FAMILIES.values() for g in f)
        return [r for r in self.runs if r.plan is not None and r.complete and r.id not in self.exclude and r.gpu in gpus]

    def loss(self, cal: Calibration, runs) -> float:
        preds = self.predictions(cal, runs)
        return sum(math.log(p / r.measured_time_s) ** 2 for p, r in zip(preds, runs))

    def _with_gpu(self, family: str, names, x) -> Calibration:
        upd = {n: _clip(v, lo, hi) for (n, lo, hi), v in zip(GPU_FIT[family], x)}
        gpus = dict(self.cal.gpus)
        for g in FAMILIES[family]:
            gpus[g] = replace(gpus[g], **upd)
        return replace(self.cal, gpus=gpus)

    def _with_globals(self, x) -> Calibration:
        upd = {n: _clip(v, lo, hi) for (n, lo, hi), v in zip(GLOBAL_FIT, x)}
        shared = {n: _clip(v, lo, hi) for (n, lo, hi), v in zip(SHARED_GPU_FIT, x[len(GLOBAL_FIT):])}
        gpus = {g: replace(p, **shared) for g, p in self.cal.gpus.items()}
        return replace(self.cal, globals=replace(self.cal.globals, **upd), gpus=gpus)

    def fit_family(self, family: str) -> None:
        runs = self.fit_runs(family)
        base = self.cal.gpus[FAMILIES[family][0]]
        x0 = [getattr(base, n) for n, _, _ in GPU_FIT[family]]
        step = [0.1 * (hi - lo) for _, lo, hi in GPU_FIT[family]]
        best = nelder_mead(lambda x: self.loss(self._with_gpu(family, None, x), runs), x0, step)
        self.cal = self._with_gpu(family, None, best)

    def fit_globals(self) -> None:
        runs = self.fit_runs()
        first = next(iter(self.cal.gpus.values()))
        x0 = [getattr(self.cal.globals, n) for n, _, _ in GLOBAL_FIT] + [getattr(first, n) for n, _, _ in SHARED_GPU_FIT]
        step = [0.1 * (hi - lo) for _, lo, hi in GLOBAL_FIT + SHARED_GPU_FIT]
        self.cal = self._with_globals(nelder_mead(lambda x: self.loss(self._with_globals(x), runs), x0, step, 60))


def run_fit(fit: Fit, rounds: int) -> Calibration:
    """``rounds`` block rounds (globals, then each family) from the priors; the fitted calibration."""
    for _ in range(rounds):
        fit.fit_globals()
        for fam in FAMILIES:
            if fit.fit_runs(fam):
                fit.fit_family(fam)
    return fit.cal


def _row_report(fit: Fit) -> list[dict]:
    out = []
    for r in fit.runs:
        role = "excluded" if r.plan is None else "incomplete" if not r.complete else (
            "holdout" if r.id in HOLDOUT else "outlier" if r.id in OUTLIERS else "fit")
        row = {"id": r.id, "gpu": r.gpu, "category": r.category, "role": role, "metric": r.metric,
               "assumptions": r.assumptions, "why_excluded": r.excluded or None}
        if r.plan is not None:
            pred = predict_time_s(r, estimator_for(r, fit.cal))
            row.update(measured_time_s=r.measured_time_s, predicted_time_s=round(pred, 4),
                       error_pct=round(error_pct(pred, r.measured_time_s), 2))
        out.append(row)
    return out


def _summary(rows: list[dict]) -> dict:
    out = {}
    for role in ("fit", "holdout"):
        for cat in ("dense", "moe"):
            errs = [abs(r["error_pct"]) for r in rows if r["role"] == role and r["category"] == cat]
            if errs:
                out[f"{role}_{cat}"] = {"rows": len(errs), "mape_pct": round(statistics.mean(errs), 2),
                                        "max_abs_error_pct": round(max(errs), 2)}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--residuals-only", action="store_true",
                    help="keep the fitted parameters of --out; recompute only the rows' predictions, residuals and "
                         "summary (after a schedule or estimator change that the fit need not follow)")
    args = ap.parse_args(argv)
    if args.residuals_only:
        return residuals_only(Path(args.out))
    t0 = time.perf_counter()
    fit = Fit(load_rows(DATA))
    run_fit(fit, args.rounds)
    g = fit.cal.globals
    frag = fit_frag_fraction(memory_cases(load_rows(DATA), g.overhead_gib * 2**30))
    fit.cal = replace(fit.cal, globals=replace(g, frag_fraction=frag))
    rows = _row_report(fit)
    cal = replace(fit.cal, balance={g: machine_balance(gpu_entry(g).spec) for g in fit.cal.gpus})
    meta = {
        "version": 1,
        "written_by": "benchmarks/calibrate.py",
        "data": "benchmarks/data/measured_runs.json",
        "method": __doc__.split("Rows are mapped")[1].split("Writes the")[0].strip(),
        "families": {k: list(v) for k, v in FAMILIES.items()},
        "fitted_parameters": {"per_family": {k: [n for n, _, _ in v] for k, v in GPU_FIT.items()},
                              "global": [n for n, _, _ in GLOBAL_FIT],
                              "shared_by_all_gpus": [n for n, _, _ in SHARED_GPU_FIT]},
        "priors": PRIOR_SOURCES,
        "derivation_rule": "GPU types without rows: parameters of a fitted type of the same architecture family, "
                           "else of the fitted type with the nearest machine balance (peak FLOP / HBM byte); "
                           "efficiencies are fractions of the GPU's own peaks (calibration.derive_params).",
        "holdout": list(HOLDOUT),
        "outliers": OUTLIERS,
        "summary": _summary(rows),
        "rows": rows,
        "fit_seconds": round(time.perf_counter() - t0, 1),
    }
    cal = replace(cal, meta=meta)
    Path(args.out).write_text(json.dumps(to_dict(cal), indent=1) + "\n", encoding="utf-8")
    print(json.dumps({"globals": asdict(cal.globals), "gpus": {g: asdict(p) for g, p in cal.gpus.items()},
                      "summary": meta["summary"]}, indent=1))


def residuals_only(path: Path) -> None:
    """Rewrite the stored rows' predictions and residuals (and the summary) under the current estimator,
    parameters unchanged."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    fit = Fit(load_rows(DATA))
    fit.cal = load_calibration(path)
    fresh = {r["id"]: r for r in _row_report(fit)}
    for r in doc["rows"]:
        if "error_pct" in r and r["id"] in fresh:
            r["predicted_time_s"], r["error_pct"] = fresh[r["id"]]["predicted_time_s"], fresh[r["id"]]["error_pct"]
    doc["summary"] = _summary(doc["rows"])
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(doc["summary"], indent=1))


if __name__ == "__main__":
    main()


# ---------------------------------------------------------------- leave-one-out by one Gauss-Newton refit


def fitted_vector(fit: Fit) -> list[tuple[str, str, float, float]]:
    """The fitted parameters as (block, name, low, high): block 'global', 'shared' or a family name."""
    out = [("global", n, lo, hi) for n, lo, hi in GLOBAL_FIT] + [("shared", n, lo, hi) for n, lo, hi in SHARED_GPU_FIT]
    for fam in FAMILIES:
        if fit.fit_runs(fam):
            out += [(fam, n, lo, hi) for n, lo, hi in GPU_FIT[fam]]
    return out


def _get(cal: Calibration, block: str, name: str) -> float:
    if block == "global":
        return getattr(cal.globals, name)
    gpu = next(iter(cal.gpus)) if block == "shared" else FAMILIES[block][0]
    return getattr(cal.gpus[gpu], name)


def _set(cal: Calibration, block: str, name: str, value: float) -> Calibration:
    if block == "global":
        return replace(cal, globals=replace(cal.globals, **{name: value}))
    gpus = FAMILIES[block] if block != "shared" else tuple(cal.gpus)
    return replace(cal, gpus={g: replace(p, **{name: value}) if g in gpus else p for g, p in cal.gpus.items()})


def gauss_newton_loo(fit: Fit, cal: Calibration, targets) -> dict[str, float]:
    """Leave-one-out prediction of each run in ``targets`` (Runs) from one Gauss-Newton refit without it,
    started at the fitted calibration ``cal``: the log residuals r(θ) = log(pred/measured) of the fit rows are
    linearised in the free parameters (central differences; a parameter at its bound stays fixed, as an active
    box constraint), Δ minimises Σ_{k≠i} (r_k + J_k Δ)², and the row is predicted - the nonlinear model, not the
    linearisation - at θ + Δ (clipped to the box). For linear least squares this is the exact leave-one-out
    (the PRESS residual r_i / (1 - h_ii)); here it is its first-order version, checked against exact refits in
    estimator_fidelity.md. Returns predicted seconds per run id. Holdout and outlier rows are not in the fit, so
    their in-sample prediction already is out of sample."""
    import numpy as np

    rows = fit.fit_runs()
    params = fitted_vector(fit)
    x0 = np.array([_get(cal, b, n) for b, n, _, _ in params])
    free = [j for j, (b, n, lo, hi) in enumerate(params) if lo + 1e-9 * (hi - lo) < x0[j] < hi - 1e-9 * (hi - lo)]

    def resid(c: Calibration, runs) -> np.ndarray:
        return np.array([math.log(predict_time_s(r, estimator_for(r, c)) / r.measured_time_s) for r in runs])

    r0 = resid(cal, rows)
    J = np.zeros((len(rows), len(free)))
    for col, j in enumerate(free):
        b, n, lo, hi = params[j]
        h = 1e-3 * (hi - lo)
        up, dn = min(hi, x0[j] + h), max(lo, x0[j] - h)
        J[:, col] = (resid(_set(cal, b, n, up), rows) - resid(_set(cal, b, n, dn), rows)) / (up - dn)
    out = {}
    ids = [r.id for r in rows]
    for run in targets:
        keep = np.array([i != run.id for i in ids])
        if keep.all():  # not a fit row: its in-sample prediction is out of sample
            out[run.id] = predict_time_s(run, estimator_for(run, cal))
            continue
        delta, *_ = np.linalg.lstsq(J[keep], -r0[keep], rcond=None)
        c = cal
        for col, j in enumerate(free):
            b, n, lo, hi = params[j]
            c = _set(c, b, n, float(min(hi, max(lo, x0[j] + delta[col]))))
        out[run.id] = predict_time_s(run, estimator_for(run, c))
    return out
