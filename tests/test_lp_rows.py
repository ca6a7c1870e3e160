"""HiGHS' node model written at once (lp.highs_model over LinModel.dense(apart=True)) against the rows one at a time
(``Row.sparse``, as before): the same LP inside HiGHS once it has solved it (column-wise, entry for entry: a row's
entries now come by variable, not by first appearance, which HiGHS' row-to-column copy does not see), the same
iterations and the same solution, with and without the cut-off row and a column order; the dense terms are
``Row.sparse``'s floats exactly."""

from __future__ import annotations

import math
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_cpsat_rows import _models

from haap_milp.solvers.common import lp
from haap_milp.solvers.common.model import INF, LinModel, Row


def _rows_one_by_one(lm, cutoff_s=None, order=None):
    """The rows part of ``highs_model`` as it was: per row ``Row.sparse``, first appearance first."""
    h = lp.highspy.Highs()
    h.setOptionValue("output_flag", False)
    n, ne = len(lm.names), len(lm.exprs)
    order = np.arange(n) if order is None else np.asarray(order)
    col = np.r_[lp.columns(order), np.arange(n, n + ne)]
    inf = lp.highspy.kHighsInf
    obj, const = lm.objective()
    cost = np.zeros(n + ne)
    for i, c in obj.items():
        cost[col[i]] = c
    lb = np.r_[np.array(lm.lb, float)[order], np.full(ne, -inf)]
    ub = np.r_[np.array([u if math.isfinite(u) else inf for u in lm.ub], float)[order], np.full(ne, inf)]
    h.addVars(n + ne, lb, ub)
    h.changeColsCost(n + ne, np.arange(n + ne, dtype=np.int32), cost)
    lo, up, starts, idx, val = [], [], [], [], []
    for row in lm.rows:
        own, refs = row.sparse()
        starts.append(len(idx))
        idx.extend(own)
        val.extend(own.values())
        idx.extend(n + e for e in refs)
        val.extend(refs.values())
        lo.append(row.lb - row.const if math.isfinite(row.lb) else -inf)
        up.append(row.ub - row.const if math.isfinite(row.ub) else inf)
    for e, terms in enumerate(lm.exprs):
        starts.append(len(idx))
        nz = {v: c for v, c in terms.items() if c != 0}
        idx.extend(nz)
        val.extend(-c for c in nz.values())
        idx.append(n + e)
        val.append(1.0)
        lo.append(0.0)
        up.append(0.0)
    if cutoff_s is not None:
        starts.append(len(idx))
        idx.extend(obj)
        val.extend(obj.values())
        lo.append(-inf)
        up.append(cutoff_s - const)
    h.addRows(len(lo), np.array(lo), np.array(up), len(idx), np.array(starts, np.int32),
              col[np.array(idx, np.int64)].astype(np.int32), np.array(val, float))
    return h


def _lp_of(h) -> dict:
    m = h.getLp()
    a = m.a_matrix_
    return {"cost": list(m.col_cost_), "cl": list(m.col_lower_), "cu": list(m.col_upper_), "rl": list(m.row_lower_),
            "ru": list(m.row_upper_), "format": a.format_, "start": list(a.start_), "index": list(a.index_),
            "value": list(a.value_)}


def _solved(h) -> dict:
    h.setOptionValue("presolve", "off")
    h.run()
    info = h.getInfo()
    return {**_lp_of(h), "status": str(h.getModelStatus()), "iterations": info.simplex_iteration_count,
            "objective": info.objective_function_value, "x": list(h.getSolution().col_value)}


def test_highs_model_is_the_rows_one_by_one():
    checked = 0
    for i, lm in enumerate(_models()):
        order = np.random.default_rng(i).permutation(len(lm.names)) if i % 3 == 0 else None
        cutoff = 1.0 + i if i % 2 else None
        new = _solved(lp.highs_model(lm, integer=False, cutoff_s=cutoff, order=order))
        assert new["format"] == lp.highspy.MatrixFormat.kColwise
        assert new == _solved(_rows_one_by_one(lm, cutoff, order)), i
        checked += 1
    assert checked >= 20


def test_apart_terms_are_sparse_terms():
    """``dense(apart=True)`` per row: ``Row.sparse``'s own terms and expression terms (column n + e), floats exact."""
    lm = LinModel(t=None)
    lm.names = ["a", "b", "c"]
    a = lm.expr({0: 0.1, 2: 0.7})
    b = lm.expr({2: 0.2})
    lm.rows = [Row([(a, 3.0), (b, 1.0), ({2: 0.3, 0: -0.3}, 1.0), (a, 0.1)], -INF, 0.0, "tdef", 0.5, exprs=lm.exprs),
               Row([(a, 1.0), (a, -1.0), ({1: 2.0}, 1.0)], 0.0, 1.0, exprs=lm.exprs)]
    for lm_ in [lm, *list(_models())[:6]]:
        rid, var, val = lm_.dense(lm_.rows, apart=True)
        n = len(lm_.names)
        for r, row in enumerate(lm_.rows):
            own, refs = row.sparse()
            want = sorted([*own.items(), *((n + e, c) for e, c in refs.items())])
            assert list(zip(var[rid == r].tolist(), val[rid == r].tolist())) == want, r
