"""The slot formulation of formulations/README.md as a solver-neutral linear model.

``cpsat.py`` scales the time coefficients to integers (formulations/cpsat.md), ``milp.py``
passes them as floats (formulations/milp.md); both solve exactly this model. Row kinds:

* ``exact``: integer coefficients (assignment, contiguity, memory, GPUs, engine rules);
* ``tdef``: ``sum_i a_i x_i + a_0 - T <= 0`` with ``a`` in seconds and ``T`` a time variable
  (tau or sigma): defines the maxima (eqs. T2, T3);
* ``cut``: ``sum_i a_i x_i - cap * tau <= 0``, the GPU-time cut (eq. C1);
* ``tcap``: eq. T1's expression (without eq. EX1's terms) ``<= T_max`` (eq. TX1e; CP-SAT states it in its own
  integer units, ``cpsat._time_cap``).

The model owns its objective (``LinModel.objective``, eq. T1) and the completion of a warm
start (``LinModel.complete``): each ``tdef`` row records the time variable it defines
(``Row.defines``), so no engine finds rows by their label.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from haap_milp.pipeline import BWD_SHARE, END_SEND_SHARE, SEND_SHARE, TIME_RTOL, interleaved_inflight_chunks, sync_share
from haap_milp.problem import Assignment, Problem, Stage
from haap_milp.solvers.common.slot_bounds import Tables, link_half

INF = float("inf")


class Row:
    """One row ``lb <= sum a x + const <= ub``. Its terms are kept as ``pieces``, each ({var: coefficient} or an
    expression id of ``LinModel.exprs``, scale), summed in order: ``idx`` and ``coef`` give them expanded (the dense
    row every engine reads), ``sparse`` keeps the expressions apart (``common.lp.highs_model`` gives each one column,
    eq. N2c)."""

    __slots__ = ("_dense", "_exprs", "const", "defines", "kind", "label", "lb", "pieces", "ub")

    def __init__(self, pieces: list, lb: float, ub: float, kind: str = "exact", const: float = 0.0, label: str = "",
                 defines: int = -1, exprs: list | None = None):
        self.pieces, self.lb, self.ub, self.kind = pieces, lb, ub, kind
        self.const, self.label, self.defines = const, label, defines  # defines: tdef rows, the time variable (tau or
        self._exprs = exprs  # sigma) whose lower bound the row is
        self._dense: tuple[list, list] | None = None

    def _expand(self) -> tuple[list, list]:
        if self._dense is None:
            d: dict = {}
            for terms, scale in self.pieces:
                for v, c in (self._exprs[terms] if isinstance(terms, int) else terms).items():
                    d[v] = d.get(v, 0.0) + c * scale
            d = {v: c for v, c in d.items() if c != 0}
            self._dense = (list(d), list(d.values()))
        return self._dense

    @property
    def idx(self) -> list[int]:
        return self._expand()[0]

    @property
    def coef(self) -> list[float]:
        return self._expand()[1]

    def sparse(self) -> tuple[dict, dict]:
        """({var: coefficient}, {expression id: coefficient}): the row with its expressions as terms of their own."""
        own: dict = {}
        refs: dict = {}
        for terms, scale in self.pieces:
            if isinstance(terms, int):
                refs[terms] = refs.get(terms, 0.0) + scale
            else:
                for v, c in terms.items():
                    own[v] = own.get(v, 0.0) + c * scale
        return {v: c for v, c in own.items() if c != 0}, {e: c for e, c in refs.items() if c != 0}


@dataclass
class LinModel:
    t: Tables
    names: list[str] = field(default_factory=list)
    lb: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    xn: dict = field(default_factory=dict)  # (k, i) -> var
    xf: dict = field(default_factory=dict)
    nv: dict = field(default_factory=dict)
    used: dict = field(default_factory=dict)  # k -> var (absent: constant 1 for k <= p_min)
    z: dict = field(default_factory=dict)  # (k, g, h) -> var
    slots: dict = field(default_factory=dict)  # k -> local options with variables at slot k
    w: dict = field(default_factory=dict)  # signature -> var (eq. U1)
    tau: int = -1
    sigma: int = -1
    obj_time: dict = field(default_factory=dict)  # var -> seconds coefficient (sum t + sum c)
    obj_const: float = 0.0  # seconds (constant p2p terms)
    zw: dict = field(default_factory=dict)  # (g, h) -> var: the wrap boundary last -> first (eq. I1, vpp > 1)
    # eq. N2c: linear expressions ({var: seconds}) that rows name by id, e.g. a slot's time t_k, which eq. T2's
    # in-flight rows and eq. T3's rows each sum over many slots
    exprs: list = field(default_factory=list)
    _xs: dict = field(default_factory=dict, repr=False)  # (k, i) -> ``x``'s dict, made once (read-only)

    def var(self, name: str, lb: float, ub: float, integer: bool = True) -> int:
        self.names.append(name)
        self.lb.append(lb)
        self.ub.append(ub)
        self.integer.append(integer)
        return len(self.names) - 1

    def add(self, terms: dict, lb: float, ub: float, kind: str = "exact", const: float = 0.0, label: str = "",
            defines: int = -1):
        terms = {k: c for k, c in terms.items() if c != 0}
        self.rows.append(Row([(terms, 1.0)], lb, ub, kind, const, label, defines, self.exprs))

    def expr(self, terms: dict) -> int:
        """Eq. N2c: the id of a new expression ``terms`` ({var: coefficient}; kept, not copied) for ``pieces``."""
        self.exprs.append(terms)
        return len(self.exprs) - 1

    def tdef(self, terms: dict, time_var: int, q: float = 1.0, const: float = 0.0, label: str = "",
             pieces: list | None = None) -> None:
        """A defining row ``sum a x + a_0 <= q * T`` of the time variable T (eqs. T2, T3); ``pieces``: its terms as
        (terms or expression id, scale) pairs summed in order (eq. N2c) instead of ``terms``."""
        if pieces is None:
            self.add({**terms, time_var: -q}, -INF, 0, kind="tdef", const=const, label=label, defines=time_var)
            return
        self.rows.append(Row([*pieces, ({time_var: -q}, 1.0)], -INF, 0, "tdef", const, label, time_var, self.exprs))

    @property
    def aux(self) -> tuple[int, int]:
        """The time variables defined as maxima of their ``tdef`` rows: tau (eq. T2), sigma (eq. T3)."""
        return self.tau, self.sigma

    def objective(self) -> tuple[dict, float]:
        """Eq. T1 in seconds: ({var: coefficient}, constant) of (M - 1) tau + sum t + sum c + sigma."""
        obj = dict(self.obj_time)
        obj[self.tau] = obj.get(self.tau, 0.0) + self.t.tau_weight  # M - 1 (eq. T1) or M - 1/vpp (eq. I1)
        obj[self.sigma] = obj.get(self.sigma, 0.0) + 1.0
        return obj, self.obj_const

    def complete(self, vals: dict, lift: Callable[[Row], tuple[list, float]] | None = None,
                 lower: dict | None = None) -> dict:
        """Completes ``vals`` (every structural variable, e.g. from ``hint_values``) with the time
        variables: each at the largest of its lower bound and its defining rows (eqs. T2, T3), the
        least value that satisfies them. ``lift(row) -> (coefficients, constant)`` restates a row in
        another unit (CP-SAT's integer time, eq. CP1); the values are then rounded up to integers and
        ``lower`` gives the lower bounds in that unit. Updates ``vals`` in place and returns it."""
        best = {v: (lower[v] if lower is not None else self.lb[v]) for v in self.aux}
        for row in self.rows:
            v = row.defines
            if v < 0:
                continue
            coefs, const = lift(row) if lift is not None else (row.coef, row.const)
            q = -coefs[row.idx.index(v)]  # min(k, M) on the in-flight rows (eq. T2), else 1
            val = (sum(c * vals[i] for i, c in zip(row.idx, coefs) if i != v) + const) / q
            best[v] = max(best[v], math.ceil(val) if lift is not None else val)
        vals.update(best)
        return vals

    def dense(self, rows: list[Row], apart: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``Row.idx`` and ``Row.coef`` of ``rows`` all at once, with the same floats (each term c * scale, a
        variable's repeats summed in the order of its pieces, zeros dropped), ordered by (row, variable) instead of
        first appearance: (row position, variable, coefficient), each [terms]. ``apart``: ``Row.sparse`` instead, an
        expression e one term of its own (variable ``len(names) + e``, its scales summed in order; eq. N2c). For
        engines that write every row: expanding the rows one at a time took 0.75 of the 1.15 s CP-SAT's rows took on
        mixtral-8x22b x hetero3-1024 (31,500 rows in 28 node models, their slot-time expressions repeated in many
        rows, eq. N2c)."""
        vs: list = []
        cs: list = []
        rid: list = []
        scales: list = []
        n = len(self.names)
        for r, row in enumerate(rows):
            for terms, scale in row.pieces:
                if apart and isinstance(terms, int):
                    vs.append(n + terms)
                    cs.append(1.0)
                    rid.append((r, 1))
                else:
                    d = self.exprs[terms] if isinstance(terms, int) else terms
                    vs.extend(d)
                    cs.extend(d.values())
                    rid.append((r, len(d)))
                scales.append(scale)
        lens = np.array([k for _, k in rid], np.int64)
        row_of = np.repeat(np.array([r for r, _ in rid], np.int64), lens)
        var = np.array(vs, np.int64)
        val = np.array(cs, float) * np.repeat(np.array(scales, float), lens)  # (c * 1.0 is c: as _expand's c * scale)
        order = np.lexsort((var, row_of))  # stable: a variable's repeats stay in the order of its pieces
        row_of, var, val = row_of[order], var[order], val[order]
        first = np.r_[True, (row_of[1:] != row_of[:-1]) | (var[1:] != var[:-1])] if len(var) else np.zeros(0, bool)
        starts = np.flatnonzero(first)
        out = val[starts]
        for k in np.flatnonzero(np.diff(np.r_[starts, len(var)]) > 1).tolist():  # repeats (few): summed in order
            total = 0.0
            for c in val[starts[k]:(starts[k + 1] if k + 1 < len(starts) else len(var))].tolist():
                total = total + c
            out[k] = total
        keep = out != 0
        return row_of[starts][keep], var[starts][keep], out[keep]

    def x(self, k: int, i: int) -> dict:
        """{var: 1} for x[k,i] = xn[k,i] + xf[k,i]; one dict per (k, i), shared by every caller, who only reads it
        (the slot rows read it about 8 times per (k, i); xn and xf are set once, by ``_slot_vars``)."""
        d = self._xs.get((k, i))
        if d is None:
            d = self._xs[k, i] = {v: 1 for v in (self.xn.get((k, i)), self.xf.get((k, i))) if v is not None}
        return d


def _acc(d: dict, terms: dict, scale: float = 1.0) -> None:
    for v, c in terms.items():
        d[v] = d.get(v, 0.0) + c * scale


def build_model(problem: Problem, t: Tables, tau_lb: float = 0.0) -> LinModel:
    """Variables and rows of eqs. A1-A4, M3, D1, G1, G2, W1, U1, U2, T1-T3, Z1, C1, C2, S1, TX1e for one variant, and
    the objective's extra terms of eq. EX1 when the variant has them."""
    m = LinModel(t)
    _slot_vars(m)
    _slot_rows(problem, m)
    _time_rows(problem, m, tau_lb)
    _time_cap_row(problem, m)  # before eq. EX1 joins the objective: the row bounds T alone
    _extra_objective(problem, m)
    _symmetry_rows(m)
    return m


def _time_cap_row(problem: Problem, m: LinModel) -> None:
    """Eq. TX1e: (M - 1) tau + sum t + sum c + sigma <= T_max (seconds; the constant p2p terms in ``const``)."""
    if problem.max_time_s is None:
        return
    obj, const = m.objective()
    m.add(obj, -INF, float(problem.max_time_s), kind="tcap", const=const, label="TX1e time bound")


def _extra_objective(problem: Problem, m: LinModel) -> None:
    """Eq. EX1: the variant's linear terms added to the objective (per used slot: a constant per option, per
    layer, the embedding's when first, the head's at slot 1)."""
    x = problem.variants[m.t.v].extra
    if x is None:
        return
    for k, opts in m.slots.items():
        for i in opts:
            o = int(m.t.opts[i])
            _acc(m.obj_time, m.x(k, i), float(x.per_stage[o]))
            _acc(m.obj_time, {m.nv[k, i]: float(x.per_layer[o])})
            if (k, i) in m.xf:
                _acc(m.obj_time, {m.xf[k, i]: float(x.first[o])})
            if k == 1:
                _acc(m.obj_time, m.x(k, i), float(x.last[o]))
    m.obj_const += float(x.const)


def _slot_vars(m: LinModel) -> None:
    t = m.t
    for k in range(1, t.p_max + 1):
        if k > t.p_min:
            m.used[k] = m.var(f"used[{k}]", 0, 1)
        nf, f = t.nonfirst_ok(k), t.first_ok(k)
        for i in np.flatnonzero(nf | f):
            i = int(i)
            hi = max(int(t.U[k - 1, i]) if nf[i] else 0, int(t.Uf[k - 1, i]) if f[i] else 0)
            if nf[i]:
                m.xn[k, i] = m.var(f"xn[{k},{i}]", 0, 1)
            if f[i]:
                m.xf[k, i] = m.var(f"xf[{k},{i}]", 0, 1)
            m.nv[k, i] = m.var(f"n[{k},{i}]", 0, hi)
            m.slots.setdefault(k, []).append(i)


def _used(m: LinModel, k: int) -> tuple[dict, float]:
    """used_k as (terms, constant)."""
    if k <= m.t.p_min:
        return {}, 1.0
    if k in m.used:
        return {m.used[k]: 1}, 0.0
    return {}, 0.0


def _slot_rows(problem: Problem, m: LinModel) -> None:
    t = m.t
    layers: dict = {}
    gpu_rows: dict = {}
    for k in range(1, t.p_max + 1):
        terms, const = _used(m, k)
        row = {v: -c for v, c in terms.items()}
        nf_row: dict = {}
        for i in m.slots.get(k, []):
            v = m.nv[k, i]
            _acc(row, m.x(k, i))
            if (k, i) in m.xn:
                nf_row[m.xn[k, i]] = 1
            xn, xf = m.xn.get((k, i)), m.xf.get((k, i))
            up = {v: 1, **({xn: -int(t.U[k - 1, i])} if xn is not None else {}),
                  **({xf: -int(t.Uf[k - 1, i])} if xf is not None else {})}
            m.add(up, -INF, 0, label="M3 upper")  # n <= U x  (memory + cut-off, eqs. M3, X1)
            low = {v: 1, **({xn: -int(t.lo[k - 1, i])} if xn is not None else {}),
                   **({xf: -int(t.lof[k - 1, i])} if xf is not None else {})}
            m.add(low, 0, INF, label="D1 lower")  # n >= lo x (one layer at least; dominance)
            layers[v] = 1
            for g in np.flatnonzero(t.use[i]).tolist():  # eq. G1 (a mixed option: each of its groups)
                _acc(gpu_rows.setdefault(g, {}), m.x(k, i), float(t.use[i, g]))
        m.add(row, const, const, label="A1 one option per used slot")
        if k < t.p_max:
            nterms, nconst = _used(m, k + 1)
            _acc(nf_row, nterms, -1.0)
            m.add(nf_row, nconst, nconst, label="A2 non-first iff next slot used")
        if k + 1 in m.used and k in m.used:
            m.add({m.used[k]: 1, m.used[k + 1]: -1}, 0, INF, label="A3 contiguous")
    m.add(layers, t.L, t.L, label="A4 all layers")
    for g, row in gpu_rows.items():
        m.add(row, -INF, problem.group_capacity[g], label="G1 GPUs")
    _budget_row(problem, m)
    _cg_cuts(problem, m)
    _rule_rows(problem, m)


def _budget_row(problem: Problem, m: LinModel) -> None:
    """Eq. W1: sum over used slots of the chosen option's integer weight <= limit (an ``exact`` row)."""
    b = problem.budget
    if b is None:
        return
    row: dict = {}
    for k, opts in m.slots.items():
        for i in opts:
            _acc(row, m.x(k, i), float(b.weight[int(m.t.opts[i])]))
    m.add(row, float(b.lower) if b.lower > 0 else -INF, float(b.limit), label="W1 budget")  # eq. W1b: its floor


def _cg_cuts(problem: Problem, m: LinModel) -> None:
    """Eq. G2: Chvatal-Gomory rounding of G1 by each stage size q of the group:
    sum floor(d_o / q) x[k,o] <= floor(cap_g / q) (at most 5 stages of 64 GPUs fit in 344)."""
    t = m.t
    pairs = [(k, i) for k, opts in m.slots.items() for i in opts]  # (slot order, then option order: the rows' order)
    if not pairs:
        return
    at = np.array([i for _, i in pairs])
    xs: list | None = None
    for g in range(t.use.shape[1]):
        cap = problem.group_capacity[g]
        use = t.use[at, g]  # [pairs]
        for q in sorted(set(t.use[:, g].tolist()) - {0}):
            if q <= 1 or cap % q == 0:
                continue
            sel = np.flatnonzero(use >= q).tolist()
            if not sel:
                continue
            xs = xs if xs is not None else [m.x(k, i) for k, i in pairs]
            row: dict = {}
            for j, c in zip(sel, (use[sel] // q).tolist()):
                _acc(row, xs[j], float(c))
            m.add(row, -INF, cap // q, label="G2 CG cut")


def _rule_rows(problem: Problem, m: LinModel) -> None:
    t = m.t
    if problem.uniform:  # eq. U1
        for s in np.unique(t.sig):
            m.w[int(s)] = m.var(f"w[{s}]", 0, 1)
        m.add(dict.fromkeys(m.w.values(), 1), 1, 1, label="U1 one signature")
        for k in range(1, t.p_max + 1):
            for s, ws in m.w.items():
                row: dict = {}
                for i in m.slots.get(k, []):
                    if t.sig[i] == s:
                        _acc(row, m.x(k, i))
                if row:
                    row[ws] = -1
                    m.add(row, -INF, 0, label="U1 signature")
    if problem.same_tp_first_last:  # eq. U2
        for p in np.unique(t.tp):
            row: dict = {}
            for (k, i), v in m.xf.items():
                if t.tp[i] == p:
                    _acc(row, {v: 1})
            for i in m.slots.get(1, []):
                if t.tp[i] == p:
                    _acc(row, m.x(1, i), -1.0)
            if row:
                m.add(row, 0, 0, label="U2 tp first = tp last")


def _groups_at(m: LinModel, k: int) -> dict:
    out: dict = {}
    for i in m.slots.get(k, []):
        _acc(out.setdefault(int(m.t.group[i]), {}), m.x(k, i))
    return out


def _time_rows(problem: Problem, m: LinModel, tau_lb: float) -> None:
    t, c = m.t, m.t.coef
    tau_hi = t.tau_ub * (1 + TIME_RTOL) if t.tau_ub is not None else INF
    m.tau = m.var("tau", max(0.0, tau_lb), tau_hi, integer=False)
    m.sigma = m.var("sigma", 0.0, INF, integer=False)
    cut: dict = {}
    bcut: dict = {}  # eq. C2
    b = problem.budget
    bw = None if b is None or b.limit <= 0 else np.asarray(b.weight, float) / b.limit
    slot_t: dict = {}
    slot_s: dict = {}
    for k in range(1, t.p_max + 1):
        tk: dict = {}
        sk: dict = {}
        for i in m.slots.get(k, []):
            v = m.nv[k, i]
            x, xf = m.x(k, i), m.xf.get((k, i))
            _acc(tk, {v: c["layer_time"][i]})
            _acc(sk, x, c["sync_fixed"][i])
            _acc(sk, {v: c["sync_per_layer"][i]})
            if xf is not None:
                _acc(tk, {xf: c["first_time"][i]})
                _acc(sk, {xf: c["sync_first"][i]})
            if k == 1:
                _acc(tk, x, c["last_time"][i])
                _acc(sk, x, c["sync_last"][i])
            for g in np.flatnonzero(t.use[i]).tolist():  # eq. C1: GPU-time of each group the option uses
                d = float(t.use[i, g])
                _acc(cut.setdefault(g, {}), {v: c["layer_time"][i] * d})
                if xf is not None:
                    _acc(cut[g], {xf: c["first_time"][i] * d})
                if k == 1:
                    _acc(cut[g], x, c["last_time"][i] * d)
            if bw is not None:
                _acc(bcut, tk_i(m, k, i, c), bw[int(t.opts[i])])
        m.tdef(tk, m.tau, label="T2 tau >= t_k")
        slot_s[k] = sk
        _acc(m.obj_time, tk, 1.0 / t.vpp if t.vpp > 1 else 1.0)  # eq. I1: sum t / vpp
        slot_t[k] = tk
    for g, row in cut.items():
        m.add({**row, m.tau: -float(problem.group_capacity[g])}, -INF, 0, kind="cut", label="C1 GPU-time")
    if bcut:  # eq. C2: sum_j (w_j / B) t_j <= tau, since every t_j <= tau and sum_j w_j <= B (eq. W1)
        m.add({**bcut, m.tau: -1.0}, -INF, 0, kind="cut", label="C2 budget-time")
    boundary = {k: _boundary(m, k, tau_hi) for k in range(1, t.p_max)}
    if problem.p2p_blocking:
        _blocking_rows(m, slot_t, boundary)
    ts = _ids(m, slot_t)  # eq. N2c: t_k and c_k named once, summed by the rows below
    cs = _ids(m, {b: terms for b, (terms, _) in boundary.items()})
    if t.vpp > 1:  # eqs. I1-I3 (pipeline.py's forms, here on the slots)
        _interleaved_rows(m, ts, cs, boundary, tau_hi)
    else:
        _inflight_rows(m, ts, cs, boundary, windows=not problem.p2p_blocking)
    _sync_rows(m, ts, slot_s, sync_beta(problem, t))


def sync_beta(problem: Problem, t: Tables) -> float:
    """The share of the earlier stages' time eq. T3's rows credit: BWD_SHARE / vpp interleaved (eq. I1), else
    ``pipeline.sync_share`` (0 under blocking sends)."""
    return BWD_SHARE / t.vpp if t.vpp > 1 else sync_share(problem.p2p_blocking)


def tk_i(m: LinModel, k: int, i: int, c: dict) -> dict:
    """t of option i at slot k as {var: seconds}: n layers, the embedding when first, the head at slot 1."""
    out = {m.nv[k, i]: c["layer_time"][i]}
    xf = m.xf.get((k, i))
    if xf is not None:
        _acc(out, {xf: c["first_time"][i]})
    if k == 1:
        _acc(out, m.x(k, i), c["last_time"][i])
    return out


def _sync_rows(m: LinModel, ts: dict, slot_s: dict, beta: float = BWD_SHARE) -> None:
    """Eq. T3: sigma >= s_k - beta * (time of the slots before k in the pipeline, i.e. k' > k):
    a later stage starts its DP sync as soon as its own last backward ends (the slot times named by expression,
    eq. N2c; ``ts``: slot -> expression id of t_k)."""
    before: list = []
    for k in range(m.t.p_max, 0, -1):
        m.tdef({}, m.sigma, label="T3 sigma >= s_k - beta*before",
               pieces=[(slot_s.get(k, {}), 1.0), *before])
        if k in ts:
            before.append((ts[k], -beta))


def sigma_limit_rows(m: LinModel, cap: float, beta: float) -> None:
    """Eq. N22b: with sigma <= ``cap`` (eq. N22) each slot's own DP sync is limited. Slot k has at most p_max - k stages
    before it, each no longer than tau's upper bound, so eq. T3's row gives s_k <= cap + beta (p_max - k) tau_hi; per
    option that bounds its layers there (or leaves it no room). ``beta``: the share eq. T3's rows credit (``_sync_rows``).
    """
    t, c = m.t, m.t.coef
    tau_hi = m.ub[m.tau]
    if not math.isfinite(tau_hi):
        return
    m.ub[m.sigma] = min(m.ub[m.sigma], cap)
    for k in range(1, t.p_max + 1):
        room = cap + beta * (t.p_max - k) * tau_hi
        for i in m.slots.get(k, []):
            base = room - c["sync_fixed"][i] - (c["sync_last"][i] if k == 1 else 0.0)
            row = {m.nv[k, i]: c["sync_per_layer"][i]}
            if (k, i) in m.xn:
                row[m.xn[k, i]] = -base
            if (k, i) in m.xf:
                row[m.xf[k, i]] = -(base - c["sync_first"][i])
            m.add(row, -INF, 0, label="N22b slot sync <= cap + beta*before")


def _blocking_rows(m: LinModel, slot_t: dict, boundary: dict) -> None:
    """Eq. T2b: tau >= t_j + SEND_SHARE (c_{j-1} + c_j) when pipeline sends block their stages. Slot k's
    links are boundary k (to the earlier slot k+1) and boundary k-1 (to the later slot k-1); unused ones add
    nothing."""
    c_max = float(np.max(m.t.p2p)) if m.t.p2p.size else 0.0
    for k in range(1, m.t.p_max + 1):
        row = dict(slot_t.get(k, {}))
        const = 0.0
        share = END_SEND_SHARE if k == 1 else SEND_SHARE  # slot 1 is the last stage: its round trip
        for b in (k, k - 1):
            terms, c0 = boundary.get(b, ({}, 0.0))
            _acc(row, {v: share * x for v, x in terms.items()})
            const += share * c0
        m.tdef(row, m.tau, const=const, label="T2b tau >= t_j + e_j (c_{j-1} + c_j)")
        first = {m.xf[k, i]: 1.0 for i in m.slots.get(k, ()) if (k, i) in m.xf}
        later, c0 = boundary.get(k - 1, ({}, 0.0))
        if k > 1 and first and (later or c0):
            # the first stage (slot k with a first-position option; boundary k is then unused) pays its whole
            # round trip: the extra (END - SEND) c_{k-1}, released by c_max when slot k is not first (big-M)
            extra = END_SEND_SHARE - SEND_SHARE
            row2 = dict(row)
            _acc(row2, {v: extra * x for v, x in later.items()})
            _acc(row2, first, extra * c_max)
            m.tdef(row2, m.tau, const=const + extra * c0 - extra * c_max, label="T2b first stage")


def _ids(m: LinModel, parts: dict) -> dict:
    """Eq. N2c: an expression id for each non-empty {var: seconds} of ``parts`` (slot times t_k, boundaries c_k)."""
    return {k: m.expr(terms) for k, terms in parts.items() if terms}


def _inflight_rows(m: LinModel, ts: dict, cs: dict, boundary: dict, windows: bool = True) -> None:
    """Eq. T2's window terms: for a <= b < M, slots a..b and the b-a links between them take at most b-a+1
    periods (a = 1: the in-flight round trip of the stage at slot b; a > 1: the cycle through slot a's own
    forward-before-backward order). Unused slots add nothing, and a row reaching beyond the pipeline is implied by
    the row that ends at the first stage (its sum is the same, its count smaller). ``windows`` False: the rows
    a = 1 only (under blocking sends eq. T2b's rows imply the others). Each row names the slot times and links by
    expression (eq. N2c; ``ts``, ``cs``: slot, boundary -> id): O(P) terms, not O(P x options); O(P^2) rows."""
    top = min(m.t.p_max, m.t.M - 1)
    for a in range(1, top + 1 if windows else 2):
        pieces: list = []
        const = 0.0
        for k in range(a, top + 1):
            if k in ts:
                pieces.append((ts[k], 1.0))
            if k > a:
                if k - 1 in cs:
                    pieces.append((cs[k - 1], 1.0))
                const += boundary.get(k - 1, ({}, 0.0))[1]
                m.tdef({}, m.tau, float(k - a + 1), const=const, label="T2 in-flight" if a == 1 else "T2 window",
                       pieces=list(pieces))


def _interleaved_rows(m: LinModel, ts: dict, cs: dict, boundary: dict, tau_hi: float) -> None:
    """Eqs. I1-I3 on the slots of an interleaved variant (P = num_stages fixed, slot k = stage P - k): the wrap
    boundary c_w (last stage -> first, transport rows like Z1), its cost (vpp - 1) c_w in the objective, tau >=
    (vpp - 1) c_w / 2, and per slot k the round-trip row R_k <= N_k tau of eq. I3 with
    R_k = (v+1)/2 sum_{k'<=k} t + (v-1)/2 sum_{k'>k} t + v(v+1)/2 sum_{b<k} c_b + v(v-1)/2 (sum_{b>=k} c_b + c_w)
    (boundary b joins slots b+1 and b), its slot times and links named by expression (eq. N2c). The boundaries'
    vpp * c_b / 2 rows and vpp * sum c cost are set by ``_boundary``."""
    t, v, p = m.t, m.t.vpp, m.t.num_stages
    wrap, w0 = _wrap(m, tau_hi)
    _acc(m.obj_time, wrap, v - 1.0)
    m.obj_const += (v - 1.0) * w0
    m.tdef({x: (v - 1) / 2 * c for x, c in wrap.items()}, m.tau, const=(v - 1) / 2 * w0,
           label="I2 tau >= (vpp-1) c_w/2")
    for k in range(1, p + 1):
        pieces: list = []
        const = 0.0
        for kk in range(1, p + 1):
            if kk in ts:
                pieces.append((ts[kk], (v + 1) / 2 if kk <= k else (v - 1) / 2))
        for b in range(1, p):
            f = v * (v + 1) / 2 if b < k else v * (v - 1) / 2
            if b in cs:
                pieces.append((cs[b], f))
            const += f * boundary.get(b, ({}, 0.0))[1]
        pieces.append((wrap, v * (v - 1) / 2))
        const += v * (v - 1) / 2 * w0
        q = float(interleaved_inflight_chunks(p - k, p, t.M, v))  # eq. I4
        m.tdef({}, m.tau, q, const=const, label="I3 round trip", pieces=pieces)
    _interleaved_windows(m, ts, cs, boundary, wrap, w0)


def _interleaved_windows(m: LinModel, ts: dict, cs: dict, boundary: dict, wrap: dict, w0: float) -> None:
    """Eq. I7's rows (``pipeline.interleaved_window_means``; stage j is slot P - j, link c_j boundary P - j - 1):
    per window of n links sum t + vpp sum c (+ (vpp - 1) c_w through the wrap) <= (2n + 1) tau, its slot times
    and links named by expression (eq. N2c). O(P^2) rows of O(P) terms."""
    t, v, p = m.t, m.t.vpp, m.t.num_stages
    steady = [interleaved_inflight_chunks(j, p, t.M, v) < t.M * v for j in range(p)]

    def stage(j: int, pieces: list) -> None:
        if p - j in ts:
            pieces.append((ts[p - j], 1.0))

    def link(j: int, pieces: list) -> float:  # c_j, stage j -> j + 1: its variable part, and its constant
        b = p - j - 1
        if b in cs:
            pieces.append((cs[b], float(v)))
        return v * boundary.get(b, ({}, 0.0))[1]

    for j in (j for j in range(p) if steady[j]):
        pieces: list = []
        const = 0.0
        stage(j, pieces)
        for k in range(j + 1, p):
            const += link(k - 1, pieces)
            stage(k, pieces)
            m.tdef({}, m.tau, float(2 * (k - j) + 1), const=const, label="I7 window", pieces=list(pieces))
    if p < 2 or not steady[0]:
        return
    for j in range(1, p):
        pieces = [(wrap, v - 1.0)]
        const = (v - 1.0) * w0
        for i in range(j, p):
            stage(i, pieces)
            if i < p - 1:
                const += link(i, pieces)
        n = p - j - 1
        for k in range(j):
            if k:
                const += link(k - 1, pieces)
            stage(k, pieces)
            n += 1
            m.tdef({}, m.tau, float(2 * n + 1), const=const, label="I7 wrap window", pieces=list(pieces))


def _wrap(m: LinModel, tau_hi: float) -> tuple[dict, float]:
    """c_w = p2p[last stage's endpoint, first stage's endpoint] as (terms, constant): transport variables
    zw[g, h] with sum_h zw[g, h] = (last stage in g) and sum_g zw[g, h] <= (first stage in h)."""
    t = m.t
    last = _groups_at(m, 1)
    first: dict = {}
    for (k, i), x in m.xf.items():
        _acc(first.setdefault(int(t.group[i]), {}), {x: 1})
    if not last or not first:
        return {}, 0.0
    # eq. X1: tau >= (vpp - 1) c_w / 2 (eq. I2), so a wrap link slower than that at tau_hi gets no variable
    return _transport(m, last, first, lambda g, h: ("zw", (g, h)), tau_hi, "I1 wrap", t.vpp - 1), 0.0


def _transport(m: LinModel, up: dict, down: dict, key, tau_hi: float, label: str, crossings: int = 1) -> dict:
    """Eq. Z1's transport rows between the endpoints of an earlier (``up``) and a later (``down``) stage, each
    {endpoint: {var: coefficient}}: sum_h z[g, h] = u_up[g], sum_g z[g, h] <= u_down[h]. ``key(g, h)``: the
    variable's (dict name on m, key). Links whose ``crossings`` transfers of c/2 per micro-batch (eqs. T2, I2: 1, vpp
    interleaved, vpp - 1 on the wrap) alone take longer than ``tau_hi`` get no variable (eq. X1). Returns
    {z: p2p price}."""
    t = m.t
    half = link_half(t.p2p, crossings)
    cost: dict = {}
    zin: dict = {h: {} for h in down}
    for g, terms in up.items():
        row = {v: -cc for v, cc in terms.items()}
        for h in down:
            if half[g, h] > tau_hi:
                continue
            store, idx = key(g, h)
            zv = m.var(f"{store}[{','.join(map(str, idx))}]", 0, 1, integer=False)
            getattr(m, store)[idx] = zv
            row[zv] = 1
            zin[h][zv] = 1
            cost[zv] = float(t.p2p[g, h])
        m.add(row, 0, 0, label=f"{label} out")
    for h, row in zin.items():
        _acc(row, down[h], -1.0)
        m.add(row, -INF, 0, label=f"{label} in")
    return cost


def _boundary(m: LinModel, k: int, tau_hi: float) -> tuple[dict, float]:
    """c_k: p2p between slot k+1 (earlier stage) and slot k (eq. T1 boundary, linearised by the
    transport rows Z1: sum_h z[k,g,h] = u[k+1,g], sum_g z[k,g,h] <= u[k,h]). Each link direction
    carries half of c_k, so tau >= c_k / 2 (eq. T2). Returns c_k as (terms, constant)."""
    t = m.t
    up, down = _groups_at(m, k + 1), _groups_at(m, k)
    if not up or not down:
        return {}, 0.0  # slot k+1 cannot be used (its A1 row forces used_{k+1} = 0) or the model is infeasible
    vals = {float(t.p2p[g, h]) for g in up for h in down}
    uterms, uconst = _used(m, k + 1)
    crossings = max(1, t.vpp)  # eq. I2: vpp crossings per micro-batch
    if len(vals) == 1 and link_half(max(vals), crossings) <= tau_hi:  # one link price: c_k = p0 * used_{k+1}
        p0 = float(next(iter(vals)))
        row = {v: p0 * cc for v, cc in uterms.items()}
        m.tdef({v: link_half(c, crossings) for v, c in row.items()}, m.tau, const=link_half(p0, crossings) * uconst,
               label="T2 tau >= c_k/2")
        _acc(m.obj_time, row, float(crossings))  # eq. I1: vpp * sum c
        m.obj_const += crossings * p0 * uconst
        return row, p0 * uconst
    cost = _transport(m, up, down, lambda g, h: ("z", (k, g, h)), tau_hi, "Z1", crossings)  # eq. X1: too slow: none
    m.tdef({v: link_half(c, crossings) for v, c in cost.items()}, m.tau, label="T2 tau >= c_k/2")
    _acc(m.obj_time, cost, float(crossings))  # eq. I1: vpp * sum c
    return cost, 0.0


def _symmetry_rows(m: LinModel) -> None:
    """Eq. S1: two consecutive non-first slots k >= max(2, M) with the same option: n[k] >= n[k+1].
    There both hold M micro-batches (same memory) and no window row of eq. T2 (those cover
    slots a..b, b < M) separates them, so swapping their layer counts changes nothing."""
    if m.t.vpp > 1:  # eqs. I3, I4 tell every slot apart: no two slots are interchangeable
        return
    for (k, i), xn in m.xn.items():
        if k < max(2, m.t.M) or (k + 1, i) not in m.nv:
            continue
        big = float(m.ub[m.nv[k + 1, i]])
        row = {m.nv[k, i]: 1, m.nv[k + 1, i]: -1, xn: -big}
        if (k + 1, i) in m.xf:
            row[m.xf[k + 1, i]] = big
        m.add(row, -big, INF, label="S1 symmetry")


def decode(m: LinModel, values) -> Assignment:
    """Variable values (indexable by var id) -> Assignment in pipeline order."""
    t = m.t
    chosen = {}
    for (k, i), v in m.nv.items():
        if any(round(values[x]) == 1 for x in m.x(k, i)):
            chosen[k] = Stage(int(t.opts[i]), round(values[v]))
    stages = tuple(chosen[k] for k in sorted(chosen, reverse=True))
    return Assignment(t.v, stages)


def hint_values(m: LinModel, a: Assignment) -> dict | None:
    """Structural variable values of an assignment (None when the model excludes it); the time
    variables are left at 0 (``start_values`` completes them)."""
    t = m.t
    p = len(a.stages)
    local = {int(o): i for i, o in enumerate(t.opts)}
    vals = dict.fromkeys(range(len(m.names)), 0.0)
    for j, st in enumerate(a.stages):
        k, i = p - j, local.get(st.option)
        key = m.xf if j == 0 else m.xn
        if i is None or (k, i) not in key or not m.lb[m.nv[k, i]] <= st.num_layers <= m.ub[m.nv[k, i]]:
            return None
        vals[key[k, i]] = 1.0
        vals[m.nv[k, i]] = float(st.num_layers)
    for k, v in m.used.items():
        vals[v] = 1.0 if k <= p else 0.0
    for (k, g, h), v in m.z.items():
        if k < p and int(t.group[local[a.stages[p - k - 1].option]]) == g \
                and int(t.group[local[a.stages[p - k].option]]) == h:
            vals[v] = 1.0
    for (g, h), v in m.zw.items():  # eq. I1's wrap: last stage's endpoint -> first stage's
        vals[v] = 1.0 if (int(t.group[local[a.stages[-1].option]]), int(t.group[local[a.stages[0].option]])) \
            == (g, h) else 0.0
    for s, v in m.w.items():
        vals[v] = 1.0 if t.sig[local[a.stages[0].option]] == s else 0.0
    return vals


def start_values(m: LinModel, a: Assignment, lift: Callable[[Row], tuple[list, float]] | None = None,
                 lower: dict | None = None) -> dict | None:
    """Every variable's value for the warm start ``a`` (None when the model excludes it):
    ``hint_values`` completed by ``LinModel.complete`` (same ``lift`` and ``lower``)."""
    vals = hint_values(m, a)
    return None if vals is None else m.complete(vals, lift, lower)
