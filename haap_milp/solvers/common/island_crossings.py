"""Eq. N25 (formulations/README.md): eq. N20's joint DP by cases on how often a pipeline crosses between islands.

Where every group's own digit is too many states, eq. N20 pools the groups of one GPU type over the islands (their G1
rows summed). Its least path then runs inside the better-networked island on twice that island's GPUs and never pays
the link between islands (measured: llama3-70b on h100-80g:64@ib,h100-80g:64@roce,a100-80g:64@ib,a100-80g:64@roce,
node M = 256, tau in [0.14653, 0.14959] s, P = 17: pooled 39.95 s, no plan at all with each group's GPUs exact). Every
plan crosses between islands (its neighbour links between endpoints of different islands, ``capacity_dp.island_blocks``)
either at most once or at least twice:

* at most once: the stages after the crossing lie in one island and those before it in another (or all in one), so
  the state needs only the GPUs the *current* island has used, per GPU type against that island's capacity of the
  type, and a flag; the crossing link enters the other island with nothing used (a reset). Each island's G1 rows of a
  type are then exact (summed where an island holds several groups of the type: a relaxation);
* at least twice: eq. N20's pooled state and a counter of crossings (0, 1, 2 or more); a first stage closes the
  pipeline only from a count of 2 or more.

Each case is a relaxation of its plans (the links stay exact, eq. N10's in-flight cut where eq. N20 makes it), so per
stage count P the lesser of the two bounds every plan of P stages; it is never below eq. N20's pooled value (both
cases are restrictions of its paths). The at-most-once case's least path is traced as a plan (eq. N25b). Both drop the
partial paths that cannot finish below the incumbent or the cut-off (eq. N27); the twice-or-more case runs in float32
(eq. N27b) and only for the stage counts it may lift (eq. N27c).
"""

from __future__ import annotations

import numpy as np

from haap_milp.problem import Assignment
from haap_milp.solvers.common import joint_capacity
from haap_milp.solvers.common.joint_capacity import (
    JointUnits,
    drawn_groups,
    least_paths,
    link_step,
    type_blocks,
    unit_sizes,
    unit_state,
)
from haap_milp.solvers.common.stage_dp import INF, PathDP

TWICE_FLOATS = 8_000_000  # most values of one slot's states in the twice-or-more case (it keeps about four such arrays)
# most floats over all its slots (its time: measured 7.5 ms per million on 12 endpoints, L = 32, 13 ms on 6, L = 80;
# 115 million on mixtral-8x7b x 256 GPUs x 3 types x 2 islands, 0.87 s, before eqs. N27-N27c, which make it about 2.5x
# cheaper; kept: raised to 24 / 400 million with JOINT_MAX 32768 the two-island rows lost, formulations/README.md N27):
# a node's case may not take seconds
TWICE_WORK = 120_000_000
PRUNE_ABOVE = 1e-6  # eq. N27: the twice-or-more case drops the paths that cannot finish below cut-off x (1 + this)


class _Crossings:
    """A case's step over the links (``joint_capacity.link_step``: within an island every state carries over, across
    one ``_moved``) and the buffers of its run (one node's states are up to 30 MB: fresh pages cost more than the DP)."""

    least = 0  # crossings a pipeline of the case has at least
    dtype = np.float64  # its states' floats (eq. N27b: the twice-or-more case, which traces nothing, in float32)
    traced = False  # eq. N25b: its least path is traced as a plan (the at-most-once case: exact per island)

    def __init__(self, blocks: np.ndarray, n: int):
        self.cross = (blocks[:, None] != blocks[None, :]).astype(np.int64)
        self.n = n  # states of the units alone (one flag or count value)
        self._buf: dict = {}

    def buffer(self, key, shape) -> np.ndarray:
        if key not in self._buf or self._buf[key].shape != shape:
            self._buf[key] = np.empty(shape, self.dtype)
        return self._buf[key]

    def step(self, F: np.ndarray, link: np.ndarray, out: np.ndarray) -> np.ndarray:
        return link_step(F, link, out, kind=self.cross, moved=self._moved)

    def closing(self, u: JointUnits, H):
        """(units, states) a first stage may close the pipeline from: every state."""
        return u, H

    def owed(self, dp: PathDP, size: int) -> np.ndarray:
        """Eq. N27: [states] what a partial path in each state still pays above eq. N27's least links: nothing."""
        return np.zeros(size)

    def later_at(self, F: np.ndarray, link: np.ndarray, g: int) -> np.ndarray:
        """[L+1, states] H[g]: ``step`` for the one endpoint g of the earlier slot (eq. N25b's trace, after the run)."""
        return link_step(F, link[g:g + 1], kind=self.cross[g:g + 1], moved=self._moved)[0]


class _AtMostOnce(_Crossings):
    """States [flag 0 | flag 1] x the current island's units; a crossing (only from flag 0) resets the units."""

    traced = True

    def origin(self, dp: PathDP, F: np.ndarray, g: int, left: int, s: int) -> tuple[int, int] | None:
        """(endpoint h, state) of the later slot that the least H[g][left, s] came from: within an island the same
        state, across a crossing (s = flag 1, nothing used) flag 0's least state."""
        best, arg = INF, None
        for h in range(dp.E):
            c = float(dp.link[g, h])
            if not np.isfinite(c):
                continue
            if not self.cross[g, h]:
                val, st = float(F[h, left, s]), s
            elif s == self.n:
                st = int(np.argmin(F[h, left, :self.n]))
                val = float(F[h, left, st])
            else:
                continue
            if val + c < best:
                best, arg = val + c, (h, st)
        return arg

    def _moved(self, h: int, Fh: np.ndarray) -> np.ndarray:
        """Across: flag 0's least state, entered at flag 1 with nothing used."""
        x = self.buffer(("moved", h), Fh.shape)
        x[...] = INF
        x[:, self.n] = Fh[:, :self.n].min(axis=1)
        return x


class _TwiceOrMore(_Crossings):
    """States [count 0 | 1 | 2 or more] x eq. N20's pooled units; a pipeline closes from count 2 or more."""

    least = 2
    dtype = np.float32

    def _moved(self, h: int, Fh: np.ndarray) -> np.ndarray:
        """Across: one count up (2 or more stays)."""
        n = self.n
        x = self.buffer(("moved", h), Fh.shape)
        x[:, :n] = INF
        x[:, n:2 * n] = Fh[:, :n]
        np.minimum(Fh[:, n:2 * n], Fh[:, 2 * n:], out=x[:, 2 * n:])
        return x

    def __init__(self, blocks: np.ndarray, pooled: JointUnits):
        super().__init__(blocks, pooled.size)
        self.pooled = pooled

    def closing(self, u: JointUnits, H):
        """Count 2 or more only: those states are the pooled units' (the count digit on top)."""
        return self.pooled, H[..., 2 * self.n:]

    def owed(self, dp: PathDP, size: int) -> np.ndarray:
        """Eq. N27: a path of count c still crosses 2 - c times, each crossing link above the least link."""
        across = dp.link[self.cross.astype(bool) & np.isfinite(dp.link)]
        extra = max(float(across.min()) - float(dp.link.min()), 0.0) if across.size else 0.0
        return np.repeat(np.array([2.0, 1.0, 0.0]) * extra, self.n)


def _with_digit(u: JointUnits, top: int) -> JointUnits:
    """``u`` with one more digit of 0..``top`` above its others (a flag or counter; every row enters at 0)."""
    rows = len(u.off)
    digits = np.column_stack([np.tile(u.digits, (top + 1, 1)), np.repeat(np.arange(top + 1), u.size)])
    limit = None if u.limit is None else np.column_stack([u.limit, np.full(rows, top)])
    return JointUnits(np.r_[u.R, top], u.size * (top + 1), u.off.copy(),
                      np.column_stack([u.wvec, np.zeros(rows, np.int64)]), digits, limit,
                      None if u.blocks is None else [*u.blocks, []], None if u.q is None else np.r_[u.q, 1])


def island_units(dp: PathDP, types: list[str], group_island: np.ndarray, blocks: np.ndarray) -> JointUnits | None:
    """One digit per GPU type, of units q (the gcd of what the usable options take of the type); a row's stage enters
    only where each digit stays within its island's capacity of the type (``limit``). None over half of JOINT_MAX states
    (the flag doubles them)."""
    kinds = type_blocks(types)
    q = unit_sizes(dp, kinds)
    mine = drawn_groups(dp)  # (eq. N20j: a group no usable option takes from counts for nothing)
    isl = sorted(set(blocks[blocks >= 0].tolist()))
    cap_of = {i: np.array([sum(float(dp.cap[g]) for g in c if group_island[g] == i and mine[g]) for c in kinds]) // q
              for i in isl}
    R = np.max([cap_of[i] for i in isl], axis=0).astype(np.int64)
    limit = np.array([cap_of[i] for i in blocks[dp.row_group].tolist()], np.int64)  # (island_blocks: every row has one)
    return unit_state(dp, kinds, q, R, 0.5, limit)


def crossing_bound(dp: PathDP, a: float, mu: np.ndarray, pooled: JointUnits, types: list[str],
                   group_island: np.ndarray, blocks: np.ndarray, floor: np.ndarray | None = None,
                   plans: list | None = None, cutoff: float | None = None,
                   incumbent: float | None = None) -> np.ndarray | None:
    """Eq. N25: [k_max + 1] per stage count P the lesser of the two crossing cases (inf outside the node's range or
    where neither case has a path); None where the at-most-once state is over JOINT_MAX or the twice-or-more one over
    TWICE_FLOATS (a slot) or TWICE_WORK (all slots). ``floor``: bounds per P already known (eq. N20's); the
    twice-or-more case is not run when the at-most-once case lifts none of them (the result is then at most ``floor``),
    and runs only for the counts it may lift whose floor is under ``cutoff`` (eq. N27c; the others keep their floor).
    Eq. N27 drops partial paths: the at-most-once case's that cannot finish below ``incumbent`` (its path is traced),
    the twice-or-more case's below ``cutoff`` (it bounds only)."""
    u1 = island_units(dp, types, group_island, blocks)
    if u1 is None:
        return None
    once = least_paths(dp, a, mu, _with_digit(u1, 1), plans=plans, links=_AtMostOnce(blocks, u1.size),
                       prune=incumbent)
    out = np.full(dp.k_max + 1, INF)
    for P, val in once.items():
        out[P] = val
    if floor is not None and not np.any(out > floor):
        return out  # (the lesser of the cases cannot lift any P)
    # eq. N27c: the case is run only for the counts it can lift (the at-most-once case above the floor, the floor under
    # the cut-off); the others keep the floor, a bound on all their plans
    need = [P for P in dp.first if floor is None or out[P] > floor[P] and (cutoff is None or floor[P] < cutoff)]
    k_top = max(need, default=0)
    slot = dp.E * (dp.L + 1) * 3 * pooled.size
    if not need:
        return out if floor is None else np.minimum(out, floor)
    if slot > TWICE_FLOATS or slot * k_top > TWICE_WORK:
        return None  # (the at-most-once case alone bounds only its own plans)
    # (pruned just above the cut-off: a count reported at its prune value must close the node, after _safe's margin)
    prune = None if cutoff is None else cutoff + PRUNE_ABOVE * abs(cutoff)
    twice = least_paths(dp, a, mu, _with_digit(pooled, 2), ({P: dp.first[P] for P in need}, dp.nonfirst, k_top),
                        links=_TwiceOrMore(blocks, pooled), prune=prune)
    more = np.full(dp.k_max + 1, INF) if floor is None else np.array(floor, float)
    more[need] = INF  # (a count it runs for and finds no path of: none crosses twice)
    for P, val in twice.items():
        more[P] = val
    return np.minimum(out, more)


def crossing_plan(dp: PathDP, types: list[str], group_island: np.ndarray, blocks: np.ndarray) -> Assignment | None:
    """Eq. N25b on its own (eq. LS4c's dive): the at-most-once case's least path at the node of ``dp``, nothing priced,
    as a plan (None: no state within JOINT_MAX, no path, or its trace over LINK_TRACE_MAX); the caller checks it."""
    u1 = island_units(dp, types, group_island, blocks)
    if u1 is None or not joint_capacity.link_trace_fits(dp, 2 * u1.size, dp.k_max):
        return None  # (the run would trace nothing)
    plans: list = []
    least_paths(dp, 0.0, np.zeros(len(dp.cap)), _with_digit(u1, 1), plans=plans, links=_AtMostOnce(blocks, u1.size))
    return plans[0] if plans else None
