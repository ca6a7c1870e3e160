"""Eq. B2n (formulations/README.md): a plain variant's rest term within a period cap, by an exact DP over the
multisets of stages its plans may have.

Eqs. B2i-B2k price the rest term T - (M - 1) tau of a plan within a period cap as three separate floors: the compute
sum sum_j t_j (eq. B2e's fill LP, fractional stages), the links (p_min - 1) times the least p2p, and the exposed sync
(eq. B2k: the largest stage sync a plan within the cap needs). One plan pays all three at once, and they pull apart:
few stages of many layers keep the fill and the links low but sync much; many small stages the reverse. Here, with
S the plan's largest stage sync (eq. T1c), eq. T3 gives sigma >= S - beta sum t (B2k's argument), so

    T - (M - 1) tau >= (1 - beta) sum_j t_j + S + sum_j c_j
                    >= min over stage multisets of  (1 - beta) (sum_j n_j lambda_{o_j} + phi + psi) + max(S, S_lb)
                                                   + (P - 1) p2p

(phi, psi: the first stage's embedding time and the last stage's head time; S_lb: eq. B2k's floor on S, 0 where it
does not bisect; P the stage count; p2p the least link time). The minimum is exact over integer stage counts: a table
over (layers held, GPU units used per group, first stage placed, last stage placed) takes the stages (kind, option o,
n layers) as 0/1 items (a middle stage's copies split in powers of two, a first or a last stage once), in ascending
order of their sync (s_o^0 + n s_o^1, plus s_o^f or s_o^l at an end), and after each item the table's least entry of
L layers with both ends placed, plus that sync (or S_lb), is the least value of the plans whose largest sync it is.
A stage's layers are capped as eq. B2l counts them (``caps``, built by ``bounds._joint_rest``): the cap's time and
memory, less its least sends in a pipeline of two or more stages under blocking sends (eq. B2c), the embedding's time
and first-stage memory on a first stage, the head's on a last; a one-stage plan has no sends and no link.

Sound for every plan of the variant within the cap: its stages are one of the multisets (their GPUs within each
group's, eq. G1), each stage's sync and compute at least its item's, and the stage count's range [p_min, p_max] is not
required (fewer constraints). Only where the table is small (STATE_LIMIT cells, ITEM_LIMIT items, WORK_LIMIT items x
cells: two or three GPU types in a few hundred GPUs); on thousands of GPUs and on many options eqs. B2i-B2k alone run.
"""

from __future__ import annotations

import math
from functools import reduce

import numpy as np

STATE_LIMIT = 100_000  # cells of the table: (L + 1) x prod_g (units_g + 1) x 4 end flags
WORK_LIMIT = 3_000_000  # 0/1 items x cells (each item one pass over the table: ~1 ms per 10^6 on this machine)
ITEM_LIMIT = 4_000  # 0/1 items (built in Python: ~2 us each)


def joint_rest(t, capacity, caps: dict, beta: float, p2p: float, floor: float) -> float | None:
    """The least value of eq. B2n over the stage multisets of ``t`` (Tables of a plain variant) within the layer caps
    (seconds; +inf: no multiset holds the L layers; None: the table or its items exceed the limits). ``capacity``: GPUs
    per group; ``caps``: [n] a stage's most layers per option as a middle stage ("mid"), the first ("first": with the
    embedding's time and memory) and the last ("last": the head's) of a pipeline of two or more stages, and alone
    ("one": both)."""
    c, L = t.coef, t.L
    s0, s1, lt = c["sync_fixed"], c["sync_per_layer"], c["layer_time"]
    best = math.inf
    if t.p_min <= 1:  # a one-stage plan: no link, no sends; the embedding and the head on its one stage
        for o in np.flatnonzero(caps["one"] >= L).tolist():
            S = float(s0[o] + s1[o] * L + c["sync_first"][o] + c["sync_last"][o])
            best = min(best, (1 - beta) * float(L * lt[o] + c["first_time"][o] + c["last_time"][o]) + max(S, floor))
    if t.p_max < 2:
        return best
    table = _units(t, capacity)
    if table is None:
        return None
    units, gcaps, shape = table
    count = _count(t, caps, units, gcaps)
    if count > ITEM_LIMIT or count * 4 * math.prod(shape) > WORK_LIMIT:
        return None
    items = _items(t, caps, units, gcaps, beta, p2p)
    dp = np.full((*shape, 2, 2), math.inf)  # [layers, units per group..., first stage placed, last stage placed]
    dp[(0,) * (len(shape) + 2)] = 0.0
    ends = (1 - beta) * float(c["first_time"].min() + c["last_time"].min())  # (at least this more on every plan)
    for S, kind, bundles in items:
        if max(S, floor) + ends >= best:
            break  # (items come in ascending sync: every later value is at least this)
        for n, w, cost in bundles:
            grow = (slice(n, None),) + tuple(slice(wi, None) for wi in w)
            keep = (slice(0, L + 1 - n),) + tuple(slice(0, k + 1 - wi) for k, wi in zip(gcaps, w, strict=True))
            dst, src = grow + _FLAGS[kind][0], keep + _FLAGS[kind][1]
            np.minimum(dp[dst], dp[src] + cost, out=dp[dst])  # (a 0/1 item: the right side is a copy of the old table)
        f = float(dp[L][..., 1, 1].min())
        if math.isfinite(f):
            best = min(best, f - p2p + max(S, floor))
    return best


# per kind of stage, the (destination, source) indices of the two end flags: a middle stage keeps them, a first or a
# last stage sets its own (once)
_FLAGS = {"mid": ((slice(None), slice(None)), (slice(None), slice(None))),
          "first": ((1, slice(None)), (0, slice(None))),
          "last": ((slice(None), 1), (slice(None), 0))}


def _units(t, capacity) -> tuple | None:
    """(per used group the GPU unit (gcd of its options' GPUs), the units each group holds, the table's shape without
    the end flags), None past STATE_LIMIT."""
    used = [g for g in range(t.use.shape[1]) if (t.use[:, g] > 0).any()]
    units = {g: int(reduce(math.gcd, t.use[t.use[:, g] > 0, g].astype(np.int64).tolist())) for g in used}
    caps = [int(capacity[g]) // units[g] for g in used]
    shape = (t.L + 1, *[k + 1 for k in caps])
    if 4 * math.prod(shape) > STATE_LIMIT:
        return None
    return units, caps, shape


def _weights(t, units: dict) -> np.ndarray:
    """[n, groups used] each option's GPUs in its groups' units."""
    return np.stack([t.use[:, g] // u for g, u in units.items()], axis=1).astype(np.int64)


def _count(t, caps: dict, units: dict, gcaps: list) -> int:
    """How many 0/1 items ``_items`` makes (at most: the same count before dropping bundles that do not fit)."""
    w = _weights(t, units)
    room = np.where(w > 0, np.asarray(gcaps, np.int64)[None, :] // np.maximum(w, 1), t.p_max).min(axis=1)
    copies = np.minimum(room, t.p_max)
    bundles = np.floor(np.log2(np.maximum(copies, 1))) + 1  # (1, 2, 4, ..., the rest)
    layers = {kind: np.clip(caps[kind], 0, t.L) for kind in ("mid", "first", "last")}
    return int((layers["mid"] * bundles * (copies > 0) + (layers["first"] + layers["last"]) * (copies > 0)).sum())


def _items(t, caps: dict, units: dict, gcaps: list, beta: float, p2p: float) -> list:
    """[(sync S, kind, [(layers, units per group, cost), ...])] in ascending S: each (kind, option, layer count) a
    stage; a middle one's copies (as many as every group's units allow, at most p_max) in powers of two, a first or a
    last one once; cost (1 - beta) times its compute (n lambda, plus the embedding's or the head's time) + p2p per
    stage."""
    c = t.coef
    s0, s1, lt = c["sync_fixed"], c["sync_per_layer"], c["layer_time"]
    extra = {"mid": (0.0 * lt, 0.0 * lt), "first": (c["first_time"], c["sync_first"]),
             "last": (c["last_time"], c["sync_last"])}
    out = []
    for o, w in enumerate(_weights(t, units).tolist()):
        fits = [k // wi for k, wi in zip(gcaps, w, strict=True) if wi > 0]
        if min(fits, default=1) < 1:
            continue
        for kind, (time_s, sync_s) in extra.items():
            copies = min([t.p_max, *fits]) if kind == "mid" else 1
            for n in range(1, min(int(caps[kind][o]), t.L) + 1):
                cost = (1 - beta) * (n * float(lt[o]) + float(time_s[o])) + p2p
                parts, left, k = [], copies, 1
                while left > 0:  # 1, 2, 4, ..., the rest: any count 0..copies is a sum of a subset
                    take = min(k, left)
                    if n * take <= t.L and all(wi * take <= cap for wi, cap in zip(w, gcaps, strict=True)):
                        parts.append((n * take, tuple(wi * take for wi in w), take * cost))
                    left, k = left - take, 2 * k
                if parts:
                    out.append((float(s0[o] + s1[o] * n + sync_s[o]), kind, parts))
    out.sort(key=lambda item: item[0])
    return out
