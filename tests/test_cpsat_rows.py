"""CP-SAT's rows written at once (cpsat._int_rows over LinModel.dense) against the rows one at a time: the dense
terms are Row.idx/Row.coef's floats exactly, and every node model's constraints are the ones the library's
``add_linear_constraint`` writes from eq. CP1's per-row rounding (cpsat._int_row), constraint for constraint. The
models come from small random instances and from presolve-sized ones with two islands and interleaving (their rows
share slot-time expressions, eq. N2c, and carry constants and infinite ends)."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from synthetic import large_problem, random_problem

from haap_milp import planner
from haap_milp.catalog import load_cluster, load_model
from haap_milp.solvers import cpsat
from haap_milp.solvers.common import VariantBound, build_tables
from haap_milp.solvers.common.model import INF, LinModel, Row, build_model
from haap_milp.specs import SolveOptions, TrainingSpec
from haap_milp.specs.solve import SOLVE_SPACE


def _catalog_problem():
    """llama3-8b on 64 H100 with the CLI's space: interleaved variants, whose round-trip rows (eq. I3) carry
    constants and pieces of several scales."""
    ctx = planner.Context.build(load_model("llama3-8b"), load_cluster("h100-64"),
                                TrainingSpec(global_batch_size=256, seq_len=2048), SolveOptions(threads=1, **SOLVE_SPACE))
    return ctx.presolved.problem


def _models():
    problems = [random_problem(seed) for seed in range(16)]
    problems += [large_problem(seed, num_gpus=256, num_types=2, islands=2, num_layers=24, max_stages=8,
                               micro_batches=(8, 16)) for seed in range(2)]
    problems.append(_catalog_problem())
    for problem in problems:
        for v in range(len(problem.variants))[:16]:
            t = build_tables(problem, v)
            if t.p_min == 0:
                continue
            yield build_model(problem, t, tau_lb=0.0)


def _proto_rows(lm, write) -> list[str]:
    cp = cpsat.cp_model.CpModel()
    x, _ = cpsat._variables(cp, lm, lm.t, VariantBound(0.0, 0.0, 0.0), S := 1e4)
    write(cp, lm, x, S)
    return [str(c) for c in cp.proto.constraints]


def test_dense_terms_are_the_rows_own():
    rows = terms = shared = constants = 0
    for lm in _models():
        shared += sum(isinstance(terms_, int) for row in lm.rows for terms_, _ in row.pieces)
        constants += sum(row.kind == "tdef" and row.const != 0 for row in lm.rows)
        rid, var, val = lm.dense(lm.rows)
        for r, row in enumerate(lm.rows):
            mine = rid == r
            want = sorted(zip(row.idx, row.coef))
            assert list(zip(var[mine].tolist(), val[mine].tolist())) == want, (r, row.label)
            terms += len(want)
        rows += len(lm.rows)
    assert rows > 500 and terms > 5000 and shared > 100 and constants > 100, (rows, terms, shared, constants)


def test_dense_sums_repeats_in_the_order_of_their_pieces():
    """A variable in several pieces of a row: its terms summed in piece order, as Row.idx/coef (floats exactly), a
    sum of zero dropped; rows without terms give none."""
    lm = LinModel(t=None)
    a = lm.expr({0: 0.1, 2: 0.7})
    b = lm.expr({2: 0.2, 1: 1e-17})
    lm.rows = [Row([(a, 3.0), (b, 1.0), ({2: 0.3, 0: -0.3}, 1.0)], -INF, 0.0, "tdef", 0.5, exprs=lm.exprs),
               Row([({}, 1.0)], 0.0, 1.0, exprs=lm.exprs),
               Row([({1: 2.0}, 1.0), (b, -2e17)], 0.0, 1.0, exprs=lm.exprs)]
    rid, var, val = lm.dense(lm.rows)
    for r, row in enumerate(lm.rows):
        assert list(zip(var[rid == r].tolist(), val[rid == r].tolist())) == sorted(zip(row.idx, row.coef))
    assert (rid == 0).sum() == 3 and (rid == 1).sum() == 0 and (rid == 2).sum() == 1  # (2 - 2 = 0 dropped on row 2)


def test_rows_at_once_are_the_library_rows():
    def one_by_one(cp, lm, x, S):
        for row in lm.rows:
            if row.kind != "tcap":
                cpsat._library_row(cp, lm, x, S, row)

    checked = 0
    kinds: set = set()
    for lm in _models():
        assert _proto_rows(lm, cpsat._int_rows) == _proto_rows(lm, one_by_one)
        checked += 1
        kinds |= {row.kind for row in lm.rows}
    assert checked >= 20 and {"exact", "tdef", "cut"} <= kinds, (checked, kinds)


def test_coefficients_past_int64_go_the_library_way():
    """A row whose rounded coefficients leave int64 is written by the library, which refuses it as it did before."""
    lm = next(iter(_models()))
    rows = [row for row in lm.rows if row.kind != "tcap"]
    assert cpsat._int_coefs(lm, rows, 1e4, np.arange(len(lm.names))) is not None
    assert cpsat._int_coefs(lm, rows, 1e30, np.arange(len(lm.names))) is None
    errors = []
    for write in (cpsat._int_rows, lambda cp, lm, x, S: [cpsat._library_row(cp, lm, x, S, row) for row in rows]):
        cp = cpsat.cp_model.CpModel()
        x, _ = cpsat._variables(cp, lm, lm.t, VariantBound(0.0, 0.0, 0.0), 1e4)
        with pytest.raises(Exception) as got:  # (whatever the library raises: both ways the same)
            write(cp, lm, x, 1e30)
        errors.append(type(got.value))
    assert errors[0] is errors[1]


def test_times_past_the_integers_are_an_engine_error_not_a_crash(caplog):
    """A node whose times span more than 64-bit integers hold at its scale (eq. CP1; fuzz report #1: a 1e-15 GB/s NIC,
    below what the schema now accepts, built here without validation) is an ERROR result with a clear message: no
    TypeError from OR-Tools' Domain (logged as a traceback); the node keeps its earlier bound, so the result's bound
    still holds (the other engines' and the DPs' work is in floats)."""
    cl = load_cluster("a100-80g:16")
    slow = cl.model_copy(update={"node_groups": (cl.node_groups[0].model_copy(update={"nic_bandwidth_gbps": 1e-15}),)})
    out = planner.solve(load_model("gpt3-125m"), slow, TrainingSpec(), SolveOptions(time_limit_s=3, threads=1))
    assert out.result.plan is not None and out.result.bound_s <= out.result.objective_s, out.result
    assert "CP-SAT cannot scale this node to integers" in out.result.message
    assert "TypeError" not in out.result.message and "Traceback" not in caplog.text
