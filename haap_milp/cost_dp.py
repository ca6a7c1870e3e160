"""A lower bound of a plan's cost or energy that is a sum over its stages, at a fixed steady period (eqs. CD1-CD7).

The band search (``frontier.band_search``, eqs. EB1-EB5) bounds the measure E = R T + D of a band of rates by a
McCormick under-estimator around one lower bound of T for the whole band, which stays loose (30 % on llama3-70b
x hetero3-1024 after 30 s). Here the bilinear R T is split per stage instead. For every plan and every stage j
(rate r_j: $/s or idle W of its GPUs; R = sum_j r_j; w = 1 under 1F1B, 1/vpp interleaved; beta' the sync share
of eq. T3, BWD_SHARE / vpp interleaved):

    T >= (M - w) tau + w sum_i t_i + sigma          (eqs. T1 / I1 without the links; tau_w = M - w)   (CD1)
    tau >= max(a, t_j)  on the plans whose period lies in [a, b];  t_j <= b there                   (CD2)
    w sum_i t_i + sigma >= X_j = max( w (t_j + rest_j),  w t_j + s_j + (w - beta') rest_j )
        rest_j = (L - n_j) lambda_j* + [j > 0] phi_j* + [j < P-1] psi_j*  <=  sum_{i != j} t_i       (CD3)
        (sigma >= s_j - beta' sum_{k<j} t_k, w >= w - beta' >= 0)
    lambda_j* = max(min_u lambda_u, min_u lambda_u r_u / (R_hi - r_j)): every other stage i has r_i <= R - r_j
        (u the usable options, R_hi a bound of every plan's rate; phi*, psi* alike)                    (CD3b)
    E = sum_j r_j T + D >= sum_j [ tau_w r_j max(a, t_j) + r_j X_j + M rho_j t_j ]                  (CD4, form 1)
    with R >= R_lo:  E >= sum_j [ tau_w r_j max(a, t_j) + w max(R_lo, r_j) t_j + M rho_j t_j ]
                         + max(R_lo, r_0) s_0        (R sum t >= sum_i max(R_lo, r_i) t_i, sigma >= s_0)  (CD4, form 0)
    on a band R_lo <= R <= R_hi: E >= min_path sum_j (c_j + s r_j) - s R_hi for s >= 0 (- s R_lo for s < 0)   (CD6)
    sigma >= theta, or every s_j < theta + beta' j b (j <= P_max - slot stages before j, each t_k <= b):
        E >= min( form 0 without the first stage's sync + R_lo theta,  form 0 over the stages within that cap )  (CD7)

Both right-hand sides are sums of stage terms whose memory depends only on the stage's slot from the end
(eq. M2), so their least value over all pipelines of a variant is a shortest path over (slots, layers), the
same DP as the time search's stage DP (eq. N4) without its links. Left out, which only lowers it: links,
sigma's other rows, eq. T2's in-flight rows, the GPU rows G1 and the engine rules U1/U2. The least over the
variants and over intervals [a, b] covering every period is a lower bound of E over every plan (CD5); the
intervals are refined best first (split at the geometric middle) while the least one is under the target, and a
path that meets every constraint is a plan, offered as a candidate. D = M sum_j rho_j t_j is exact (eq. E4;
rho = 0 for cost).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from haap_milp.deadline import Deadline
from haap_milp.pipeline import BWD_SHARE, TIME_RTOL, interleaved_tau_weight, sync_share
from haap_milp.problem import Assignment, Problem, Stage, violations
from haap_milp.solvers.common.slot_bounds import build_tables

INF = math.inf
MAX_RATIO = 1.01  # eq. CD5: an interval [a, b] with b / a at most this is not split further
MAX_TAIL = 1e6  # eq. CD5: the tail [A, inf) is not split once A is this many times the least period


class VariantCostDP:
    """Eq. CD4's shortest path for one variant: ``bound(a, b, prepare(r_lo, usable, r_hi))`` is the least right-hand
    side over the pipelines whose stage times are <= b, at tau >= a, with every stage's option in ``usable``."""

    def __init__(self, problem: Problem, v: int, rate: np.ndarray, rho: np.ndarray):
        tab = build_tables(problem, v)  # the usable options, their coefficients and memory caps per slot (eq. M2)
        var = problem.variants[v]
        self.problem, self.v, self.opts = problem, v, tab.opts
        self.L, self.K, self.M, self.vpp = tab.L, tab.K, var.num_microbatches, var.vpp
        self.p_fixed = var.num_stages if var.vpp > 1 else 0  # eq. I5: an interleaved copy's stage count
        self.w = 1.0 if var.vpp <= 1 else 1.0 / var.vpp
        self.beta = sync_share(problem.p2p_blocking) if var.vpp <= 1 else BWD_SHARE / var.vpp
        self.tau_w = interleaved_tau_weight(self.M, var.vpp)
        self.r, self.rho = rate[self.opts].astype(float), rho[self.opts].astype(float)
        self.rate_of = np.asarray(rate, float)  # by global option index (a path's rate, eq. CD6)
        self.n = np.arange(self.L + 1)
        # [L+1, L+1] at (l, m): the layers l - m left to the slots below a stage of m, and 0 where they keep at
        # least one (else inf): the shortest path's step is (V[below] + keep + stage[m]).min over m
        left = self.n[:, None] - self.n[None, :]
        self._below, self._keep = np.maximum(left, 0), np.where(left >= 1, 0.0, INF)
        c = self.c = tab.coef
        if len(self.opts):
            self.stars = (c["layer_time"].min(), c["first_time"].min(), c["last_time"].min())
            # eq. CD5: no plan has tau below L lambda* / K (tau >= max_j t_j >= sum_j t_j / P, P <= K)
            self.tau_floor = self.L * self.stars[0] / max(self.K, 1)
        # per (first, last): stage time [O, L+1], the part of the cost that does not depend on a, and the memory
        # caps; the middle and first stages at slots k >= 2 use the sorted form of ``_slot_min``
        self.kind = {}
        for first in (False, True):
            for last in (False, True):
                self.kind[first, last] = self._kind(c, tab, first, last)
        # eq. CD7: the largest stage sync of any option and layer count (theta's bisection range)
        self.sync_max = max(float(k["s"][np.isfinite(k["s"])].max(initial=0.0)) for k in self.kind.values())

    def _kind(self, c: dict, tab, first: bool, last: bool) -> dict:
        n, L = self.n[None, :], self.L
        lam = c["layer_time"][:, None]
        t = lam * n + (c["first_time"][:, None] if first else 0.0) + (c["last_time"][:, None] if last else 0.0)
        s = c["sync_fixed"][:, None] + c["sync_per_layer"][:, None] * n \
            + (c["sync_first"][:, None] if first else 0.0) + (c["sync_last"][:, None] if last else 0.0)
        caps = tab.Uf_mem if first else tab.U_mem  # [K, O]
        caps = caps[:1] if last else caps[1:]  # a last stage sits at slot 1; any other at slots 2..K
        reach = (caps[:, :, None] >= n[None, :, :]) & (n[None, :, :] >= 1)  # [slots, O, L+1]
        # slots counted from the first row: an option with n layers fits the first ``depth`` rows when memory
        # falls with the slot (eq. M1: more in flight further from the end), which ``monotone`` checks
        monotone = bool((np.diff(caps, axis=0) <= 0).all()) if len(caps) > 1 else True
        depth = reach.sum(axis=0)  # [O, L+1]
        order = np.argsort(-depth, axis=0, kind="stable")
        counts = (depth[None, :, :] >= np.arange(1, len(caps) + 1)[:, None, None]).sum(axis=1)  # [slots, L+1]
        return {"t": t, "s": s, "energy": self.M * self.rho[:, None] * t, "reach": reach, "first": first,
                "last": last, "monotone": monotone, "counts": counts,
                # flat indices into [O, L+1]: the options of each column by depth, and the last of each slot's
                "order_flat": order * (L + 1) + self.n[None, :],
                "count_flat": np.maximum(counts - 1, 0) * (L + 1) + self.n[None, :]}

    def _rest(self, usable: np.ndarray | None, r_hi: float) -> tuple:
        """Eq. CD3b: per option o of stage j, the least layer, first and last times of the other stages: each
        other stage i has r_i <= R - r_j <= r_hi - r_o, so t-per-layer_i >= min_u (lambda r) / (r_hi - r_o), and
        >= min_u lambda, over the usable options u ([O] arrays; inf where no other stage is affordable)."""
        c = self.c
        u = np.ones(len(self.opts), bool) if usable is None else usable[self.opts]
        if not u.any():
            return (np.full(len(self.opts), INF),) * 3
        room = r_hi - self.r
        out = []
        for key in ("layer_time", "first_time", "last_time"):
            x = c[key][u]
            per_rate = (x * self.r[u]).min()
            with np.errstate(divide="ignore", invalid="ignore"):
                lifted = np.where(room > 0, per_rate / np.where(room > 0, room, 1.0), INF)
            out.append(np.maximum(x.min(), lifted))
        return tuple(out)

    def prepare(self, r_lo: float | None = None, usable: np.ndarray | None = None, r_hi: float = INF,
                first_sync: bool = True) -> dict:
        """Per (first, last): the [O, L+1] stage terms of eq. CD4 that do not depend on the period interval (form 1
        when ``r_lo`` is None, else form 0), inf on the options not in ``usable``; ``bound`` adds the period's."""
        rest = self._rest(usable, r_hi) if r_lo is None else None
        kinds = [fl for fl in self.kind if not self.p_fixed or fl != (True, True)]  # one stage: first and last
        out = {}
        for fl in kinds:
            kind, r = self.kind[fl], self.r[:, None]
            t = kind["t"]
            if r_lo is None:
                lam, phi, psi = (x[:, None] for x in rest)
                others = self.L - self.n[None, :]  # layers of the other stages (eq. CD3)
                with np.errstate(invalid="ignore"):
                    more = np.where(others > 0, others * lam, 0.0) + (0.0 if kind["first"] else phi) + \
                        (0.0 if kind["last"] else psi)
                w = self.w
                x = kind["energy"] + r * np.maximum(w * (t + more), w * t + kind["s"] + (w - self.beta) * more)
            else:
                rr = np.maximum(r_lo, r)
                x = kind["energy"] + self.w * rr * t + (rr * kind["s"] if fl[0] and first_sync else 0.0)
            if usable is not None:
                x = np.where(usable[self.opts][:, None], x, INF)
            out[fl] = x
        return out

    def _costs(self, kind: dict, static: np.ndarray, a: float, b: float, shift: float) -> np.ndarray:
        """[O, L+1] the stage term of eq. CD4 at tau in [a, b]: inf where t > b (eq. CD2)."""
        t, r = kind["t"], self.r[:, None]
        out = static + self.tau_w * r * np.maximum(a, t) + (shift * r if shift else 0.0)
        return np.where(t > b * (1 + TIME_RTOL), INF, out)

    def _slot_min(self, kind: dict, cost: np.ndarray) -> np.ndarray:
        """[slots, L+1]: per slot and layer count the least cost over the options whose memory holds them."""
        if kind["monotone"]:
            ranked = np.minimum.accumulate(cost.ravel()[kind["order_flat"]], axis=0)  # column-wise prefix minima
            return np.where(kind["counts"] > 0, ranked.ravel()[kind["count_flat"]], INF)
        return np.where(kind["reach"], cost[None, :, :], INF).min(axis=1)

    def bound(self, a: float, b: float, prep: dict, shift: float = 0.0, path_below: float = INF,
              sync_cap: float | None = None) -> tuple[float, Assignment | None]:
        """The least eq. CD4 over the variant's pipelines at tau in [a, b] (``prep``: ``prepare``'s terms), and the
        path that reaches it when the least is below ``path_below`` (a path costs a tenth of the DP; one whose bound
        is past the incumbent's cannot be a better plan when it lies in the interval). ``shift``: eq. CD6's
        multiplier, s per unit of rate added to every stage (the caller subtracts it from the bound). ``sync_cap``:
        eq. CD7's theta: only stages whose sync s_j <= theta + beta' j b, j <= P_max - slot stages before them
        (then every plan with sigma < theta is among the paths; no path is decoded)."""
        if not len(self.opts):
            return INF, None
        L, n = self.L, self.n
        p_lo, p_hi = (self.p_fixed, self.p_fixed) if self.p_fixed else (1, self.K)
        cost = {fl: self._costs(self.kind[fl], x, a, b, shift) for fl, x in prep.items()}
        if sync_cap is not None:  # eq. CD7: the first stage (j = 0) within theta, the last within P_max - 1 stages
            for fl in cost:
                room = sync_cap + (0.0 if fl[0] else self.beta * b * (p_hi - 1))
                cost[fl] = np.where(self.kind[fl]["s"] <= room * (1 + TIME_RTOL), cost[fl], INF)
            path_below = -INF
        best, shape = INF, None  # shape: (P, layers of the first stage)
        if p_lo <= 1:
            one = self._slot_min(self.kind[True, True], cost[True, True])[0]
            best, shape = float(one[L]), (1, L)
        firsts = self._slot_min(self.kind[True, False], cost[True, False])  # row k-2: slot k >= 2
        mid = self.kind[False, False]
        if sync_cap is None:
            mids = self._slot_min(mid, cost[False, False])
        else:  # a middle stage at slot k has at most P_max - k stages before it
            slots = np.arange(2, len(mid["reach"]) + 2)[:, None, None]
            room = (sync_cap + self.beta * b * (p_hi - slots)) * (1 + TIME_RTOL)
            ok = mid["reach"] & (mid["s"][None, :, :] <= room)
            mids = np.where(ok, cost[False, False][None, :, :], INF).min(axis=1)
        V = self._slot_min(self.kind[False, True], cost[False, True])[0]  # slot 1 (the last stage), l layers
        paths = [V]
        for p in range(2, p_hi + 1):
            if p >= p_lo and p - 2 < len(firsts):
                tot = V[L - n[1:L]] + firsts[p - 2][1:L]
                if len(tot) and tot.min() < best:
                    best, shape = float(tot.min()), (p, int(np.argmin(tot)) + 1)
            if p == p_hi or p - 2 >= len(mids):
                break
            V = (V[self._below] + self._keep + mids[p - 2][None, :]).min(axis=1)  # slots 1..p hold l = row
            paths.append(V)
        if shape is None or not math.isfinite(best):
            return INF, None
        return best, (self._path(shape, paths, cost, mids) if best < path_below else None)

    def _path(self, shape, paths, cost, mids) -> Assignment:
        """The stages of the least path: the first stage's layers, then back through the slots' values."""
        p, m = shape
        L = self.L

        def pick(first: bool, last: bool, slot: int, layers: int) -> int:
            kind = self.kind[first, last]
            row = kind["reach"][0 if last else slot - 2][:, layers]
            return int(self.opts[int(np.argmin(np.where(row, cost[first, last][:, layers], INF)))])

        if p == 1:
            return Assignment(self.v, (Stage(pick(True, True, 1, L), L),))
        stages = [Stage(pick(True, False, p, m), m)]
        left = L - m
        for slot in range(p - 1, 1, -1):  # the value of slots 1..slot holding ``left`` layers is paths[slot-1]
            ks = np.arange(1, left)
            k = int(ks[np.argmin(paths[slot - 2][left - ks] + mids[slot - 2][ks])])
            stages.append(Stage(pick(False, False, slot, k), k))
            left -= k
        stages.append(Stage(pick(False, True, 1, left), left))
        return Assignment(self.v, tuple(stages))


@dataclass
class CostBound:
    """Eq. CD5's result: ``value`` bounds the measure of every plan (inf: no plan), ``plans`` are the paths that
    meet every constraint of the problem, ``complete`` says whether every interval was bounded (a deadline can
    stop the search before; then ``value`` is what the intervals bounded so far prove: still a bound)."""

    value: float
    plans: list
    dps: int
    complete: bool
    floors: list  # per DP: the least bound of its variant's intervals (inf: none left)


def cost_bound(dps: list[VariantCostDP], target: float, *, r_lo: float | None = None,
               usable: np.ndarray | None = None, deadline: Deadline | None = None,
               max_ratio: float = MAX_RATIO, r_hi: float = INF, floors: list[float] | None = None) -> CostBound:
    """Eq. CD5: the least eq. CD4 bound over the variants and the periods tau in [0, inf), refined best first until
    the least interval reaches ``target`` (the incumbent less the gap: nothing left to prove) or is narrower than
    ``max_ratio``. Form 1 (``r_hi`` an upper bound of every plan's rate, eq. CD3b) and
    form 0 when ``r_lo`` (a lower bound of every plan's rate) is given; on a band (both given) eq. CD6 lifts each
    interval's bound by the rate multiplier. Paths are kept from the intervals whose bound is below ``target`` (the
    others hold no better plan). ``floors``: per DP, a bound of its variant over a superset of these plans with
    settings no tighter (``CostBound.floors`` of the whole problem's search); a variant whose floor reaches the
    target is not searched again (its floor still counts in the value)."""
    heap: list = []
    count = [0]
    plans: dict = {}
    lagrange = math.isfinite(r_hi) and r_lo is not None  # eq. CD6 on a band of rates

    preps: dict = {}
    shifts: dict = {}  # (dp, a, b) -> eq. CD6's multiplier of form 0 there (eq. CD7 starts from it)

    def run(dp: VariantCostDP, a: float, b: float, form_lo, shift: float = 0.0):
        key = (id(dp), form_lo)
        if key not in preps:
            preps[key] = dp.prepare(form_lo, usable, r_hi)
        x, path = dp.bound(a, b, preps[key], shift, path_below=INF if lagrange else target)
        count[0] += 1
        if path is not None and x - shift * (r_hi if shift > 0 else r_lo or 0.0) < target and path not in plans \
                and not violations(dp.problem, path):
            plans[path] = None
        return x, (None if path is None else float(sum(dp.rate_of[s.option] for s in path.stages)))

    def value(dp: VariantCostDP, a: float, b: float) -> float:
        got = []
        for form_lo in ((None,) if r_lo is None else (None, r_lo)):
            x, rate = run(dp, a, b, form_lo)
            if lagrange and rate is not None and x < target:
                lifted, shift = _lagrange(lambda s: run(dp, a, b, form_lo, s), x, rate, r_lo, r_hi, deadline)
                x = max(x, lifted)
                if form_lo is not None:
                    shifts[id(dp), a, b] = lifted, shift
            got.append(x)
            if x >= target or (deadline is not None and deadline.expired()):
                break  # one form prunes the interval (the other cannot lower the larger), or time is up: each is a bound
        return max(got)

    def sync_value(dp: VariantCostDP, a: float, b: float) -> float:
        """Eq. CD7 on form 0 at the band's multiplier (eq. CD6): every plan has sigma >= theta (case A: the paths
        without the first stage's sync, plus r_lo theta) or every stage's s_j < theta + beta' j b (case B: the
        paths of those stages); the larger of the two cases' least, bisected on theta."""
        if (id(dp), a, b) in shifts:  # value() found it when it bounded this interval
            base, shift = shifts[id(dp), a, b]
        else:
            shift = 0.0
            base, rate = run(dp, a, b, r_lo)
            if lagrange and rate is not None:
                base, shift = _lagrange(lambda s: run(dp, a, b, r_lo, s), base, rate, r_lo, r_hi, deadline)
        const = shift * (r_hi if shift > 0 else r_lo)
        key = (id(dp), "nosync")
        if key not in preps:
            preps[key] = dp.prepare(r_lo, usable, r_hi, first_sync=False)
        case_a = dp.bound(a, b, preps[key], shift, path_below=-INF)[0] - const
        count[0] += 1
        best, lo, hi = base, 0.0, dp.sync_max
        for _ in range(SYNC_STEPS):
            if deadline is not None and deadline.expired():
                break
            theta = (lo + hi) / 2
            case_b = dp.bound(a, b, preps[(id(dp), r_lo)], shift, sync_cap=theta)[0] - const
            count[0] += 1
            best = max(best, min(case_a + r_lo * theta, case_b))
            if case_a + r_lo * theta < case_b:
                lo = theta
            else:
                hi = theta
        return best

    per = [INF] * len(dps)  # per variant the least bound of its intervals
    complete = True
    for i, dp in enumerate(dps):
        if floors is not None and floors[i] >= target:
            per[i] = floors[i]
        elif deadline is not None and deadline.expired():  # not bounded here: the floor given, else nothing
            per[i], complete = floors[i] if floors is not None else 0.0, False
        elif len(dp.opts):
            # one interval from tau_floor to inf per variant, split when least: [a, inf) into [a, 2a] and
            # [2a, inf), else at sqrt(ab)
            heapq.heappush(heap, (value(dp, dp.tau_floor, INF), i, dp.tau_floor, INF, False))
    while heap and heap[0][0] < target:
        x, i, a, b, synced = heap[0]
        top = dps[i].tau_floor * MAX_TAIL
        narrow = a <= 0 or (math.isfinite(b) and b / a <= max_ratio) or (not math.isfinite(b) and a >= top)
        if narrow and (synced or r_lo is None or not math.isfinite(b)):
            break  # the least interval cannot be split usefully: its bound is the answer
        if deadline is not None and deadline.expired():
            complete = False
            break
        heapq.heappop(heap)
        if narrow:  # eq. CD7 once on it: sigma's other rows by cases on a threshold
            heapq.heappush(heap, (max(x, sync_value(dps[i], a, b)), i, a, b, True))
            continue
        mid = math.sqrt(a * b) if math.isfinite(b) else 2 * a
        for lo, hi in ((a, mid), (mid, b)):
            heapq.heappush(heap, (max(x, value(dps[i], lo, hi)), i, lo, hi, False))
    for x, i, *_ in heap:
        per[i] = min(per[i], x)
    return CostBound(min(per, default=INF), list(plans), count[0], complete, per)


LAGRANGE_STEPS = 5  # eq. CD6: bisection steps on the rate multiplier per interval and form
SYNC_STEPS = 6  # eq. CD7: bisection steps on sigma's threshold (once per least interval that cannot be split)


def _lagrange(run, x0: float, rate0: float, r_lo: float, r_hi: float,
              deadline: Deadline | None = None) -> tuple[float, float]:
    """Eq. CD6: every plan of the band has r_lo <= R <= r_hi, so for s >= 0 the least path with s r added to every
    stage, less s r_hi, bounds it too (for s < 0: less s r_lo). The path of s = 0 above r_hi (below r_lo) says
    which side; s is bisected on the side whose path's rate crosses the band's edge (the bound is concave in s).
    Returns the best bound and its s."""
    if r_lo <= rate0 <= r_hi:
        return x0, 0.0
    up = rate0 > r_hi
    edge = r_hi if up else r_lo
    best, arg, lo, hi = x0, 0.0, 0.0, 2.0 * x0 / max(edge, 1e-300)  # s is about the iteration time: E ~ R T
    for _ in range(LAGRANGE_STEPS):
        if deadline is not None and deadline.expired():
            break  # every step's value is a bound: the best so far stands
        s = (lo + hi) / 2
        x, rate = run(s if up else -s)
        if rate is None:
            hi = s
            continue
        if x - (s if up else -s) * edge > best:
            best, arg = x - (s if up else -s) * edge, (s if up else -s)
        if (rate > r_hi) if up else (rate < r_lo):
            lo = s
        else:
            hi = s
    return best, arg


def variant_dps(problem: Problem, rate: np.ndarray, rho: np.ndarray) -> list[VariantCostDP]:
    """One eq. CD4 DP per micro-batch variant of the problem."""
    return [VariantCostDP(problem, v, rate, rho) for v in range(len(problem.variants))]
