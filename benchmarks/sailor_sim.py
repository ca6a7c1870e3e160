"""Score a haap plan the way Sailor's runtime simulator does (an independent re-implementation of its formulas).

Sailor (SOSP'25) validated its runtime simulator against real runs on the Fig. 8b cluster (OPT-350M on
A100-40GB + V100-16GB, fp32, DeepSpeed, GCP us-central1-a, 4 GPUs per VM). This module re-implements, in its
own code, the formulas of that simulator so that any haap plan can be scored by the same judge:

* ``sailor/Planner/simulations/runtime_simulator.py`` (github.com/eth-easl/sailor, read from the public mirror
  saha18uiuc/sailor at commits 13b79423 / fb8d0e81; the formulas below are identical in both):
  ``Simulator.simulate_iteration_time``  -> :func:`simulate`,
  ``Simulator.get_time_per_pipeline``    -> :func:`pipeline_time`,
  ``estimate_p2p_pipeline_times``        -> :func:`p2p_times`,
  ``Simulator.estimate_sync_time``       -> :func:`sync_time`,
  ``get_ar_time_with_buckets``           -> :func:`ar_time_with_buckets`;
* ``sailor/profiling/profile_utils.py``: ``estimate_ar_time`` -> :func:`ar_time`, ``estimate_send_time`` ->
  :func:`send_time`;
* ``sailor/providers/gcp/model_networking.py``: ``get_time_on_config`` -> :func:`time_on_config`;
* ``MEMORY_BUCKET_DEEPSPEED_SIZE`` (5e8 bytes, ``sailor/Planner/sailor_planner/constants.py``).

The formulas, for one pipeline of S stages, micro-batch b, M = ceil(gbs / (b * dp_0)) micro-batches:

    comp_s   = max over the stage's replicas r of  sum over its layers l of (fwd[g_r][b][tp_r][l] + bwd[...][l])
    upd_s    = max over r of update[g_r][b][tp_r][first layer of s]          (the profile's third number)
    act_s    = max over replicas j of s of send(act_out[last layer of s] * b,  coef(g_j, tp_j -> g', tp'))
               to replica j mod dp_{s+1} of stage s+1   (s < S-1)
    grad_s   = the same for stage s's gradient to replica j mod dp_{s-1} of stage s-1, message act_out[first
               layer of s] * b   (s > 0)
    p2p_s    = act_s + grad_s (middle stages); 2 grad_s (last stage); first stage: act_s if S <= 3 else 2 act_s
    T_pp     = (M - 1) * max_s (comp_s + p2p_s) + sum_s p2p_s + sum_s comp_s + max_s upd_s
    T_sync   = max over stages, over adjacent replica pairs (j, j+1), of the bucketed ring all-reduce of
               sum_l params[l] / min(4, min tp of the stage) bytes over dp_s workers with the pair's
               1-GPU coefficients (buckets of 5e8 bytes; each bucket 2 (D-1) send(bucket / D))
               + the cross-pipeline term (one pipeline here: D = 1, zero)
    T        = T_pp + T_sync

    send(x bytes, coef [a, b, c]) = (x / 1e9) / (a u^2 + b u + c),  u = log2(x / 1e6)  (GB/s; no cap: Sailor
                                   uses only the coefficients, not the max_Bps field)
    coef(g, tp -> g', tp') = bandwidths[zone][g][min(tp, 4)][zone][g'][min(tp', 4)][0]

Sizes are fp32 (4 bytes a float), and both activation and weight sizes are taken at tp 1 (Sailor reads
``llm_info[model]['1']`` for both).

Mapping a haap plan onto Sailor's plan (assumptions, stated):
* layers: haap decoder layer k is Sailor layer id k+1; the embedding (id 0) joins the first stage and the head
  (id 25) the last;
* one pipeline (haap plans have one), ``dp_ubatch`` = the first stage's dp, so M = ceil(gbs / (mbs * dp_0)) with
  gbs = 1024 (Sailor's training config), whatever gbs the plan itself was made for;
* each data-parallel replica of a stage is one Sailor ``TMPconfig`` with a single VM (``vm_list`` of one VM of
  4 GPUs of its type; tp <= 4 so its tp GPUs sit in that VM): the VM size enters only through min(tp, 4);
* a mixed stage (``replicas``) lists its replica types in the plan's order, ``count`` replicas of each; every
  replica runs the plan's ``micro_batch_size`` (Sailor's simulator has one mbs for all; a haap mixed stage whose
  replica types run different shares of the micro-batch is scored with the common mbs and flagged);
* the pairing of replicas across stages (replica j sends to j mod dp_next) and of adjacent replicas in the
  all-reduce follows that order; for the plans scored here the result does not depend on it (see the script's
  docstring in sailor_fig8b.py);
* a profile entry that is missing (V100-16 at mbs 8, tp 1: out of memory on the real GPU) counts as zero time,
  as in Sailor's simulator (it fills missing (mbs, tp) entries with zeros).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "sailor_fig8b"
MODEL = "OPT-350"
ZONE = "us-central1-a"
GPUS_PER_VM = 4
FLOAT_SIZE = 4  # fp32 (simulator_args: fp16 false)
GPU_NAME = {"a100-40g": "A100-40", "v100-16g": "V100-16", "A100-40": "A100-40", "V100-16": "V100-16"}


@dataclass
class SailorData:
    profiles: dict  # [gpu][mbs][tp][layer] -> [fwd, bwd, update]
    llm: dict  # [tp][layer] -> {...}
    net: dict  # [zone][gpu][n][zone][gpu][n] -> [[a, b, c], max_Bps]
    bucket: float
    num_layers: int  # with embedding and head: 26

    @classmethod
    def load(cls, root: Path = DATA) -> SailorData:
        consts = json.loads((root / "constants.json").read_text())
        cfg = json.loads((root / "training_config_opt_350.json").read_text())
        return cls(json.loads((root / "profiles_tmp.json").read_text())[MODEL],
                   json.loads((root / "llm_info.json").read_text())[MODEL],
                   json.loads((root / "multizone_bandwidths_het.json").read_text()),
                   float(consts["MEMORY_BUCKET_DEEPSPEED_SIZE"]), int(cfg["num_all_layers"]))

    def layer_times(self, gpu: str, mbs: int, tp: int, layer: int) -> tuple[float, float, float]:
        entry = self.profiles.get(gpu, {}).get(str(mbs), {}).get(str(tp))
        if entry is None:  # missing (mbs, tp): zeros, as Sailor's simulate_iteration_time fills them
            return 0.0, 0.0, 0.0
        f, b, u = entry[str(layer)]
        return f, b, u

    def act_bytes(self, layer: int) -> float:
        return self.llm["1"][str(layer)]["act_output_floats"] * FLOAT_SIZE

    def weight_bytes(self, layer: int) -> float:
        return self.llm["1"][str(layer)]["params_floats"] * FLOAT_SIZE

    def coef(self, g_send: str, n_send: int, g_recv: str, n_recv: int) -> list[float]:
        return self.net[ZONE][g_send][str(n_send)][ZONE][g_recv][str(n_recv)][0]


def time_on_config(x: float, coef: list[float]) -> float:
    """model_networking.get_time_on_config: x bytes at a polynomial-in-log2(MB) bandwidth (GB/s)."""
    u = math.log2(x / 1e6)
    bw = sum(c * u ** (len(coef) - i - 1) for i, c in enumerate(coef))
    return (x / 1e9) / bw


def send_time(x: float, coef: list[float]) -> float:
    """profile_utils.estimate_send_time."""
    return 0.0 if x == 0 else time_on_config(x, coef)


def ar_time(x: float, workers: int, coef: list[float]) -> float:
    """profile_utils.estimate_ar_time: ring all-reduce, 2 (D-1) sends of x / D (mul_factor 1)."""
    if x == 0 or workers <= 1:
        return 0.0
    return 2 * (workers - 1) * time_on_config(x / workers, coef)


def ar_time_with_buckets(x: float, workers: int, coef: list[float], bucket: float) -> float:
    """runtime_simulator.get_ar_time_with_buckets: DeepSpeed's buckets, one after another."""
    t, rem = 0.0, x
    while rem > 0:
        b = min(rem, bucket)
        t += ar_time(b, workers, coef)
        rem -= b
    return t


@dataclass
class Stage:
    layers: list[int]  # Sailor layer ids
    replicas: list[tuple[str, int]]  # (Sailor gpu name, tp), one per data-parallel replica

    @property
    def dp(self) -> int:
        return len(self.replicas)


@dataclass
class Breakdown:
    M: int
    comp: list[float]
    p2p: list[float]
    update: list[float]
    t_pp: float
    t_sync: float
    sync_per_stage: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def iteration_s(self) -> float:
        return self.t_pp + self.t_sync

    @property
    def its(self) -> float:
        return 1.0 / self.iteration_s

    @property
    def straggler(self) -> float:
        return max(c + p for c, p in zip(self.comp, self.p2p))

    def terms(self) -> dict:
        """The iteration split into Sailor's terms: steady state, fill/drain, update, sync."""
        return {"(M-1) x straggler": (self.M - 1) * self.straggler, "sum comp": sum(self.comp),
                "sum p2p": sum(self.p2p), "update": max(self.update), "sync": self.t_sync}


def p2p_times(d: SailorData, stages: list[Stage], mbs: int) -> list[float]:
    """runtime_simulator.estimate_p2p_pipeline_times."""
    S = len(stages)
    out = []
    for i, st in enumerate(stages):
        act = d.act_bytes(st.layers[-1]) * mbs
        grad = d.act_bytes(st.layers[0]) * mbs
        t_act = t_grad = 0.0
        if i < S - 1:
            nxt = stages[i + 1]
            for j, (g, tp) in enumerate(st.replicas):
                g2, tp2 = nxt.replicas[j % nxt.dp]
                c = d.coef(g, min(tp, GPUS_PER_VM), g2, min(tp2, GPUS_PER_VM))
                t_act = max(t_act, send_time(act, c))
        if i > 0:
            prv = stages[i - 1]
            for j, (g, tp) in enumerate(st.replicas):
                g2, tp2 = prv.replicas[j % prv.dp]
                c = d.coef(g, min(tp, GPUS_PER_VM), g2, min(tp2, GPUS_PER_VM))
                t_grad = max(t_grad, send_time(grad, c))
        if 0 < i < S - 1:
            out.append(t_act + t_grad)
        elif i == S - 1 and S > 1:
            out.append(2 * t_grad)
        else:  # first stage (S == 1: Sailor's code takes this branch's value too, with no sends: 0)
            out.append(t_act if S <= 3 else 2 * t_act)
    return out


def sync_time(d: SailorData, stages: list[Stage]) -> tuple[float, list[float]]:
    """Simulator.estimate_sync_time for one pipeline (the cross-pipeline term is 0 with one pipeline)."""
    per = []
    for st in stages:
        tp_min = min([GPUS_PER_VM, *(tp for _, tp in st.replicas)])
        size = sum(d.weight_bytes(l) / tp_min for l in st.layers)
        t = 0.0
        for j in range(st.dp - 1):
            c = d.coef(st.replicas[j][0], 1, st.replicas[j + 1][0], 1)
            t = max(t, ar_time_with_buckets(size, st.dp, c, d.bucket))
        per.append(t)
    return max(per), per


def pipeline_time(d: SailorData, stages: list[Stage], mbs: int, M: int) -> tuple[float, list, list, list]:
    """Simulator.get_time_per_pipeline."""
    comp, upd = [], []
    for st in stages:
        c_max = u_max = 0.0
        for g, tp in st.replicas:
            c = sum(sum(d.layer_times(g, mbs, tp, l)[:2]) for l in st.layers)
            c_max = max(c_max, c)
            u_max = max(u_max, d.layer_times(g, mbs, tp, st.layers[0])[2])
        comp.append(c_max)
        upd.append(u_max)
    p2p = p2p_times(d, stages, mbs)
    straggler = max(c + p for c, p in zip(comp, p2p))
    t_pp = (M - 1) * straggler + sum(p2p) + sum(comp) + max(upd)
    return t_pp, comp, p2p, upd


def simulate(d: SailorData, stages: list[Stage], mbs: int, gbs: int = 1024) -> Breakdown:
    """Simulator.simulate_iteration_time for one pipeline: T_pp + T_sync."""
    M = math.ceil(gbs / (mbs * stages[0].dp))
    t_pp, comp, p2p, upd = pipeline_time(d, stages, mbs, M)
    t_sync, per = sync_time(d, stages)
    return Breakdown(M, comp, p2p, upd, t_pp, t_sync, per)


def stages_from_plan(plan: dict, num_layers: int = 26) -> tuple[list[Stage], list[str]]:
    """haap plan (the ``plan`` object of ``haap-solve solve --json``) -> Sailor stages; notes on approximations."""
    notes = []
    st_in = plan["stages"]
    out = []
    for k, s in enumerate(st_in):
        ids = list(range(s["first_layer"] + 1, s["first_layer"] + s["num_layers"] + 1))
        if k == 0:
            ids = [0, *ids]
        if k == len(st_in) - 1:
            ids = [*ids, num_layers - 1]
        reps: list[tuple[str, int]] = []
        if s.get("replicas"):
            for r in s["replicas"]:
                reps += [(GPU_NAME[r["gpu_type"]], int(r.get("tp", 1)))] * int(r["count"])
                if int(r["micro_batch"]) != int(plan["micro_batch_size"]):
                    notes.append(f"stage {k}: {r['gpu_type']} replicas run micro-batch {r['micro_batch']}, scored "
                                 f"at the plan's {plan['micro_batch_size']} (Sailor's simulator has one mbs)")
        else:
            reps = [(GPU_NAME[s["gpu_type"]], int(s.get("tp", 1)))] * int(s["dp"])
        out.append(Stage(ids, reps))
    covered = [l for st in out for l in st.layers]
    if covered != list(range(num_layers)):
        raise ValueError(f"plan does not cover Sailor's layers 0..{num_layers - 1} in order: {covered}")
    return out, notes


def score(plan: dict, gbs: int = 1024, data: SailorData | None = None) -> Breakdown:
    """Iteration time (s) and it/s of a haap plan as Sailor's simulator computes them."""
    d = data or SailorData.load()
    stages, notes = stages_from_plan(plan, d.num_layers)
    for k, st in enumerate(stages):
        for g, tp in set(st.replicas):
            if str(tp) not in d.profiles.get(g, {}).get(str(plan["micro_batch_size"]), {}):
                notes.append(f"stage {k}: no profile for {g} mbs {plan['micro_batch_size']} tp {tp}: zero time "
                             "(as Sailor's simulator)")
    b = simulate(d, stages, int(plan["micro_batch_size"]), gbs)
    b.notes = notes
    return b


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Score a haap plan with a re-implementation of Sailor's simulator")
    ap.add_argument("plan", type=Path, help="haap plan JSON (the solve --json document or its 'plan' object)")
    ap.add_argument("--gbs", type=int, default=1024)
    args = ap.parse_args()
    doc = json.loads(args.plan.read_text())
    b = score(doc.get("plan", doc), args.gbs)
    print(json.dumps({"iteration_s": b.iteration_s, "it_per_s": b.its, "M": b.M, "t_pp": b.t_pp,
                      "t_sync": b.t_sync, "comp": b.comp, "p2p": b.p2p, "update": b.update,
                      "sync_per_stage": b.sync_per_stage, "terms": b.terms(), "notes": b.notes}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
