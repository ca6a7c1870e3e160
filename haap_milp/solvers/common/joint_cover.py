"""Eq. B2h: eq. B2's coverage as one LP over every GPU group at once.

Eq. B2 bounds the layers the GPUs can hold at a stage time tau by a knapsack per group, the groups added up. A mixed
option (eq. H1, replicas of several groups in one stage) is an item of each group it touches, its layers split by a
weighting (eq. B2b), and each group's knapsack may take it as often as that group's GPUs allow, whatever the other
groups hold: on megatron-39b x 256 each of H100, A100-80, L40S (V100 unusable in bf16) the A100 knapsack packs four
copies of a 128 H100 + 64 A100 stage next to the H100 knapsack's own best, and variant M 8 x vpp 4 x 4 stages gets
tau >= 0.185 s where its best plan runs 0.338 s (its bound 1.61 s, the optimum 2.578 s).

Here every option o is a column x_o in [0, u_o] (u_o = min(copies_o, p_max): eq. B2g's copies) and every group g one
row: max sum_o h_o(tau) x_o  s.t.  sum_o use_og x_o <= cap_g (each g),  sum_o x_o <= p_max.
A plan whose stages all take at most tau is an integral point of it (its stages' options counted), so the LP's value
bounds the layers it holds. The LP ignores links (eq. B2's components) and eq. B2c's one-stage case is added as in
eq. B2 (``alone``); the caller takes the lesser of this and eq. B2's coverage.

Soundness does not rest on HiGHS' tolerances: every "cannot hold L layers" is certified by the Lagrangian dual of the
LP at the duals y >= 0 HiGHS returns (or the last ones that certified), which bounds the LP from above for any y:
sum_g cap_g y_g + p_max y_0 + sum_o u_o max(0, h_o - sum_g use_og y_g - y_0), computed here in floating point on
integer h. A tau whose certificate does not reach below L counts as covered (a weaker bound, never a wrong one).
"""

from __future__ import annotations

import math

import numpy as np

from haap_milp.problem import Problem
from haap_milp.solvers.common.lp import highspy

# a few thousand columns solve in well under a millisecond each (warm: only the costs change between calls); bigger
# tables keep eq. B2's knapsacks alone rather than pay for the LP at every probe of the bisection
MAX_COLUMNS = 20000


class JointCover:
    """The LP of one variant's tables, built on first use and re-solved per tau with new costs (a warm start)."""

    def __init__(self, problem: Problem, use: np.ndarray, copies: np.ndarray, p_max: int):
        self.use = np.asarray(use, float)  # [n, G] GPUs of each group an option takes
        self.cap = np.asarray(problem.group_capacity, float)
        self.ub = np.minimum(np.asarray(copies, float), float(p_max))  # [n] stages of each option at once
        self.p_max = float(p_max)
        self.rows = np.flatnonzero(self.use.any(axis=0))  # groups some option uses
        self.y = np.zeros(len(self.rows) + 1)  # the last certifying duals: groups, then the stage count
        self.h = None

    def upper(self, h: np.ndarray, y: np.ndarray) -> float:
        """The Lagrangian dual at y >= 0: an upper bound on the LP's value with layer capacities h (any y)."""
        y = np.maximum(y, 0.0)
        red = h - self.use[:, self.rows] @ y[:-1] - y[-1]
        return float(self.cap[self.rows] @ y[:-1] + self.p_max * y[-1] + self.ub @ np.maximum(red, 0.0))

    def below(self, h: np.ndarray, need: float) -> bool:
        """Whether the LP with layer capacities h ([n] integers) is certified to stay below ``need`` layers: first
        at the last certifying duals, then at the LP's own."""
        if self.upper(h, self.y) < need:
            return True
        y = self._duals(h)
        if y is None or self.upper(h, y) >= need:
            return False
        self.y = y
        return True

    def _duals(self, h: np.ndarray) -> np.ndarray | None:
        if highspy is None:  # pragma: no cover - highspy is a runtime dependency
            return None
        n = len(h)
        if self.h is None:
            self._build(n)
        self.h.changeColsCost(n, np.arange(n, dtype=np.int32), -np.asarray(h, float))
        self.h.run()
        if self.h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        return -np.asarray(self.h.getSolution().row_dual, float)  # (a minimisation: <= rows have duals <= 0)

    def _build(self, n: int) -> None:
        inf = highspy.kHighsInf
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("presolve", "off")
        h.addVars(n, np.zeros(n), self.ub)
        for g in self.rows.tolist():
            on = np.flatnonzero(self.use[:, g] > 0)
            h.addRow(-inf, float(self.cap[g]), len(on), on.astype(np.int32), self.use[on, g])
        h.addRow(-inf, self.p_max, n, np.arange(n, dtype=np.int32), np.ones(n))
        self.h = h


def lifted_tau(cover: JointCover, need: float, probe, ladder: np.ndarray) -> float:
    """Eq. B2h on eq. B2's bisection: the least tau of ``ladder`` (increasing; eq. B2's own answer first) at which
    the LP is not certified below ``need`` layers, math.inf when even the last is. ``probe(tau)`` gives (h, alone):
    the layer capacities at tau and eq. B2's one-stage plan. The LP's value grows with tau, so a bisection."""

    def covered(i: int) -> bool:
        h, alone = probe(float(ladder[i]))
        return alone >= need or not cover.below(h, need)

    lo, hi = 0, len(ladder) - 1
    if covered(lo):
        return float(ladder[lo])
    if not covered(hi):
        return math.inf
    while hi - lo > 1:  # lo not covered, hi covered
        mid = (lo + hi) // 2
        if covered(mid):
            hi = mid
        else:
            lo = mid
    return float(ladder[hi])


def usable(use: np.ndarray) -> bool:
    """Whether eq. B2h runs on these tables: the LP stays small."""
    return 0 < use.shape[0] <= MAX_COLUMNS
