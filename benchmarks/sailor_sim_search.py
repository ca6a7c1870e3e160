"""Best plan under Sailor's simulator (benchmarks/sailor_sim.py) over the shapes haap can express, by exact search.

For one Fig. 8b row (A100-40 and V100-16 counts) this enumerates, for every uniform dp D and per-replica
micro-batch b with b x D x M = gbs exactly (haap's space: gbs = mbs x dp x M), every pipeline of stages
(GPU type, tp in {1, 2, 4}: a VM holds 4 GPUs; at least one decoder layer each; the embedding in the first
stage, the head in the last) that fits the GPU counts, and scores it with the simulator's formulas
(`sailor_sim.simulate`, re-implemented here in closed form per stage, and checked against `simulate` on the
winners). Depth-first search with a sound bound: a partial pipeline's time is at least
(M - 1) x its largest settled comp + p2p, plus its stages' comp, plus its largest sync and update, plus the
remaining decoder layers at the fastest per-layer time any kind has; branches whose bound reaches the
incumbent are cut. The result is the optimum of the simulator over that space (memory is not checked here:
Sailor's simulator does not; haap's memory model is applied to the winners by `sailor_fig8b.py`).
Profile points the measured profile lacks (V100 tp 1 at micro-batch 8: out of memory) are left out, as haap
does (Sailor's simulator would price them at zero).

    python benchmarks/sailor_sim_search.py --a100 80 --v100 240 [--gbs 1024] [--top 5]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sailor_sim as ss

GPUS = ("A100-40", "V100-16")
HAAP = {"A100-40": "a100-40g", "V100-16": "v100-16g"}
TPS = (1, 2, 4)
LAST = 25  # Sailor layer ids: 0 embedding, 1..24 decoder layers, 25 head


class Row:
    """Per-kind prefix sums for one (D, mbs)."""

    def __init__(self, d: ss.SailorData, caps: dict, D: int, mbs: int):
        self.d, self.D, self.mbs = d, D, mbs
        self.kinds = [(g, tp) for g in GPUS for tp in TPS
                      if tp * D <= caps[g] and str(tp) in d.profiles[g].get(str(mbs), {})]
        self.pre = {}  # kind -> prefix sums of fwd + bwd over layer ids
        self.upd = {}
        for k in self.kinds:
            ts = [sum(d.layer_times(k[0], mbs, k[1], l)[:2]) for l in range(LAST + 1)]
            self.pre[k] = [0.0] + list(_cumsum(ts))
            self.upd[k] = [d.layer_times(k[0], mbs, k[1], l)[2] for l in range(LAST + 1)]
        w = [d.weight_bytes(l) for l in range(LAST + 1)]
        self.wpre = [0.0] + list(_cumsum(w))
        self.act = d.act_bytes(1) * mbs  # decoder and embedding outputs alike (llm_info)
        self._sync: dict = {}
        self._tau: dict = {}
        self.send = {(a, b): ss.send_time(self.act, d.coef(a[0], min(a[1], 4), b[0], min(b[1], 4)))
                     for a in self.kinds for b in self.kinds}
        self.min_send = min(self.send.values()) if self.send else 0.0
        # every stage after the first pays at least two of its own sends per micro-batch (a middle stage act +
        # grad, the last 2 x grad), each no faster than its kind's fastest send to any kind
        self.floor = {k: 2 * min(self.send[k, k2] for k2 in self.kinds) for k in self.kinds}
        # decoder layers 2..24 alike in time, weight and update: consecutive middle stages of one kind may be
        # ordered by layer count (symmetry, see search)
        self.alike = all(len({round(self.pre[k][l + 1] - self.pre[k][l], 15) for l in range(2, LAST)}) == 1
                         and len({self.upd[k][l] for l in range(2, LAST)}) == 1 for k in self.kinds) \
            and len({w for w in [self.wpre[l + 1] - self.wpre[l] for l in range(1, LAST)]}) == 1
        # fastest decoder layer of any kind (the bound's remaining work)
        self.min_layer = min((self.pre[k][l + 1] - self.pre[k][l] for k in self.kinds for l in range(1, LAST)),
                             default=math.inf)

    def tau_lb(self, rem: dict, layers: int, stages: int) -> float:
        """Least straggler compute with which ``layers`` decoder layers fit in at most ``stages`` more stages on
        the ``rem`` GPUs left per type (each kind's layers at its fastest decoder layer; p2p >= 0): a lower
        bound on the final max_s comp_s (eq. B2's knapsack, per type, joined by the stage count)."""
        key = (tuple(rem[g] for g in GPUS), layers, stages)
        if key in self._tau:
            return self._tau[key]
        if layers <= 0:
            self._tau[key] = 0.0
            return 0.0
        lam = {k: min(self.pre[k][l + 1] - self.pre[k][l] for l in range(1, LAST)) for k in self.kinds}
        cands = sorted({n * lam[k] + self.floor[k] for k in self.kinds for n in range(1, layers + 1)})

        def fits(tau: float) -> bool:
            best_by_type = []
            for g in GPUS:
                kinds = [(k[1] * self.D, int(max(0.0, tau - self.floor[k]) / lam[k] + 1e-12))
                         for k in self.kinds if k[0] == g]
                # f[s][u]: most layers with s stages on u GPUs of this type
                cap = rem[g]
                f = [[0] * (cap + 1) for _ in range(stages + 1)]
                for s_ in range(1, stages + 1):
                    for u in range(cap + 1):
                        v = f[s_ - 1][u]
                        for w, h in kinds:
                            if w <= u:
                                v = max(v, f[s_ - 1][u - w] + h)
                        f[s_][u] = v
                best_by_type.append([f[s_][cap] for s_ in range(stages + 1)])
            a, b = best_by_type
            return max(a[s_] + b[stages - s_] for s_ in range(stages + 1)) >= layers

        lo, hi = 0, len(cands) - 1
        if not cands or not fits(cands[-1]):
            self._tau[key] = math.inf
            return math.inf
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(cands[mid]):
                hi = mid
            else:
                lo = mid + 1
        self._tau[key] = cands[lo]
        return cands[lo]

    def comp(self, k, lo: int, hi: int) -> float:  # layer ids lo..hi-1
        return self.pre[k][hi] - self.pre[k][lo]

    def sync(self, k, lo: int, hi: int) -> float:
        key = (k, lo, hi)
        if key not in self._sync:
            size = (self.wpre[hi] - self.wpre[lo]) / min(4, k[1])
            c = self.d.coef(k[0], 1, k[0], 1)
            self._sync[key] = ss.ar_time_with_buckets(size, self.D, c, self.d.bucket) if self.D > 1 else 0.0
        return self._sync[key]


def _cumsum(xs):
    s = 0.0
    for x in xs:
        s += x
        yield s


def p2p_of(row: Row, kinds: list, j: int) -> float:
    """estimate_p2p_pipeline_times for stage j of a pipeline of these kinds (uniform kinds per stage)."""
    S = len(kinds)
    act = row.send[kinds[j], kinds[j + 1]] if j < S - 1 else 0.0
    grad = row.send[kinds[j], kinds[j - 1]] if j > 0 else 0.0
    if 0 < j < S - 1:
        return act + grad
    if j == S - 1 and S > 1:
        return 2 * grad
    return act if S <= 3 else 2 * act


def total(row: Row, M: int, kinds: list, cuts: list) -> float:
    """T_pp + T_sync for stages kinds[j] on layer ids cuts[j]..cuts[j+1]-1."""
    comp = [row.comp(k, cuts[j], cuts[j + 1]) for j, k in enumerate(kinds)]
    p2p = [p2p_of(row, kinds, j) for j in range(len(kinds))]
    upd = max(row.upd[k][cuts[j]] for j, k in enumerate(kinds))
    sync = max(row.sync(k, cuts[j], cuts[j + 1]) for j, k in enumerate(kinds))
    return (M - 1) * max(c + p for c, p in zip(comp, p2p)) + sum(p2p) + sum(comp) + upd + sync


class Stopped(Exception):
    pass


def search(row: Row, M: int, caps: dict, incumbent: float, max_stages: int = 12, deadline: float = math.inf):
    """Exact minimum of `total` over pipelines (kinds, cuts) that fit the GPU counts; None if none beats
    ``incumbent``. Returns (T, kinds, cuts), and the number of nodes visited."""
    best = [incumbent, None, None]
    nodes = [0]
    per_stage = {k: k[1] * row.D for k in row.kinds}

    def rec(kinds, cuts, used, settled_max, comp_sum, sync_max, upd_max):
        nodes[0] += 1
        if nodes[0] % 4096 == 0 and time.perf_counter() > deadline:
            raise Stopped
        lo = cuts[-1]
        S = len(kinds)
        # the newest stage's p2p is not settled (its successor is unknown): comp only
        last_comp = row.comp(kinds[-1], cuts[-2], lo)
        open_lb = last_comp + (row.floor[kinds[-1]] if S >= 2 else 0.0)  # its sends are not settled yet
        rem = max(0, LAST - lo) * row.min_layer  # remaining decoder layers at >= the fastest (the head: >= 0)
        left = {g: caps[g] - used[g] for g in GPUS}
        tau_rest = row.tau_lb(left, LAST - lo, max_stages - S)
        bound = (M - 1) * max(settled_max, open_lb, tau_rest) + comp_sum + rem + sync_max + upd_max
        if bound >= best[0]:
            return
        if lo == LAST + 1:
            t = total(row, M, kinds, cuts)
            if t < best[0]:
                best[:] = [t, list(kinds), list(cuts)]
            return
        if S >= max_stages:
            return
        for k in row.kinds:
            if used[k[0]] + per_stage[k] > caps[k[0]]:
                continue
            prev_p2p = p2p_of(row, kinds + [k], S - 1) if S >= 2 else None
            # stage S-1's p2p is now settled except the first stage's (it depends on the final S) and the
            # last stage's doubling: use a lower bound, the sends it has for sure
            if S == 1:
                settled = row.send[kinds[0], k]  # first stage: at least one act send
            else:
                settled = prev_p2p
            smax = max(settled_max, last_comp + settled)
            used2 = dict(used)
            used2[k[0]] += per_stage[k]
            for hi in range(lo + 1, LAST + 1):  # at least one decoder layer; the last stage takes the head
                his = (hi, LAST + 1) if hi == LAST else (hi,)
                for h in his:
                    if h == LAST:
                        continue  # the head never stands alone: it joins the stage holding layer 24
                    # symmetry: two consecutive middle stages (not the first, not the last) of one kind swap
                    # their layer counts without changing any term, so keep counts non-increasing along them
                    if row.alike and S >= 2 and k == kinds[-1] and h <= LAST - 1 and h - lo > lo - cuts[-2]:
                        continue
                    c = row.comp(k, lo, h)
                    rec(kinds + [k], cuts + [h], used2, smax, comp_sum + c, max(sync_max, row.sync(k, lo, h)),
                        max(upd_max, row.upd[k][lo]))

    for k in row.kinds:
        if per_stage[k] > caps[k[0]]:
            continue
        used = {g: 0 for g in GPUS}
        used[k[0]] = per_stage[k]
        for h in range(2, LAST + 1):
            if h == LAST:
                continue
            rec([k], [0, h], used, 0.0, row.comp(k, 0, h), row.sync(k, 0, h), row.upd[k][0])
        rec([k], [0, LAST + 1], used, 0.0, row.comp(k, 0, LAST + 1), row.sync(k, 0, LAST + 1), row.upd[k][0])
    return best, nodes[0]


def plan_of(row: Row, kinds, cuts) -> dict:
    """The haap plan object (first_layer counts decoder layers from 0) for sailor_sim.score."""
    stages = []
    for j, k in enumerate(kinds):
        first = max(cuts[j], 1) - 1
        last = min(cuts[j + 1], LAST) - 1  # decoder layers cuts[j]..cuts[j+1]-1 without 0 and 25
        stages.append({"first_layer": first, "num_layers": last - first, "gpu_type": HAAP[k[0]], "tp": k[1],
                       "dp": row.D})
    return {"micro_batch_size": row.mbs, "stages": stages}


def describe(plan: dict) -> str:
    return "; ".join(f"{s['first_layer']}–{s['first_layer'] + s['num_layers'] - 1} {s['gpu_type'].split('-')[0]} "
                     f"tp{s['tp']} dp{s['dp']}" for s in plan["stages"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a100", type=int, required=True)
    ap.add_argument("--v100", type=int, required=True)
    ap.add_argument("--gbs", type=int, default=1024)
    ap.add_argument("--incumbent-its", type=float, default=0.0, help="cut plans slower than this it/s")
    ap.add_argument("--max-stages", type=int, default=12)
    ap.add_argument("--seconds", type=float, default=math.inf, help="give up one (dp, mbs) after this long")
    ap.add_argument("--dp", type=int, nargs="+", default=[32, 16, 64, 8], help="uniform dp values, in this order")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    d = ss.SailorData.load()
    caps = {"A100-40": args.a100, "V100-16": args.v100}
    out = []
    inc = 1.0 / args.incumbent_its if args.incumbent_its > 0 else math.inf
    for D in args.dp:
        for mbs in (1, 2, 4, 8):
            if args.gbs % (mbs * D):
                continue
            M = args.gbs // (mbs * D)
            row = Row(d, caps, D, mbs)
            if not row.kinds:
                continue
            t0 = time.perf_counter()
            try:
                best, nodes = search(row, M, caps, inc, args.max_stages, t0 + args.seconds)
            except Stopped:
                print(f"dp {D} mbs {mbs} M {M}: stopped after {args.seconds:.0f} s, not exhaustive", flush=True)
                out.append({"dp": D, "mbs": mbs, "M": M, "stopped": True})
                continue
            wall = time.perf_counter() - t0
            if best[1] is None:
                print(f"dp {D} mbs {mbs} M {M}: nothing below {1 / inc if math.isfinite(inc) else 0:.4f} it/s "
                      f"({nodes} nodes, {wall:.1f} s)", flush=True)
                out.append({"dp": D, "mbs": mbs, "M": M, "best": None, "nodes": nodes})
                continue
            plan = plan_of(row, best[1], best[2])
            b = ss.score(plan, args.gbs, d)  # the simulator itself on the winner
            assert abs(b.iteration_s - best[0]) < 1e-9 * best[0], (b.iteration_s, best[0])
            print(f"dp {D} mbs {mbs} M {M}: {b.its:.4f} it/s  {describe(plan)}  ({nodes} nodes, {wall:.1f} s)",
                  flush=True)
            out.append({"dp": D, "mbs": mbs, "M": M, "its": b.its, "plan": plan, "nodes": nodes})
            inc = min(inc, b.iteration_s)  # the global optimum: later (dp, mbs) must beat the best so far
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
