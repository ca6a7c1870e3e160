"""HiGHS' node model written at once (lp.highs_model over LinModel.dense(apart=True)) against the rows one at a time
(``Row.sparse``, as highs_model read them before, put in dense's place): the same LP inside HiGHS once it has solved
it (column-wise, entry for entry: a row's entries now come by variable, not by first appearance, which HiGHS'
row-to-column copy does not see), the same iterations and the same solution, with and without the cut-off row and a
column order, each row's bounds less its constant; the dense terms are ``Row.sparse``'s floats exactly."""

from __future__ import annotations

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_cpsat_rows import _models

from haap_milp.solvers.common import lp
from haap_milp.solvers.common.model import INF, LinModel, Row


def _sparse_one_by_one(self, rows, apart=False):
    """``LinModel.dense(apart=True)`` as highs_model read the rows before: per row ``Row.sparse``, its own terms then
    its expressions (column n + e), each in order of first appearance."""
    assert apart
    n = len(self.names)
    out = []
    for r, row in enumerate(rows):
        own, refs = row.sparse()
        out += [(r, v, c) for v, c in own.items()] + [(r, n + e, c) for e, c in refs.items()]
    rid, var, val = zip(*out) if out else ((), (), ())
    return np.array(rid, np.int64), np.array(var, np.int64), np.array(val, float)


def _rows_one_by_one(lm, cutoff_s, order, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(LinModel, "dense", _sparse_one_by_one)
        return lp.highs_model(lm, integer=False, cutoff_s=cutoff_s, order=order)


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


def test_highs_model_is_the_rows_one_by_one(monkeypatch):
    checked = 0
    for i, lm in enumerate(_models()):
        order = np.random.default_rng(i).permutation(len(lm.names)) if i % 3 == 0 else None
        cutoff = 1.0 + i if i % 2 else None
        new = _solved(lp.highs_model(lm, integer=False, cutoff_s=cutoff, order=order))
        assert new["format"] == lp.highspy.MatrixFormat.kColwise
        inf = lp.highspy.kHighsInf  # each row's bounds less its constant (tdef rows: sum a x + a0 - T <= 0)
        assert new["ru"][:len(lm.rows)] == [r.ub - r.const if r.ub < INF else inf for r in lm.rows]
        assert new["rl"][:len(lm.rows)] == [r.lb - r.const if r.lb > -INF else -inf for r in lm.rows]
        assert new == _solved(_rows_one_by_one(lm, cutoff, order, monkeypatch)), i
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
