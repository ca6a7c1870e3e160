"""Eq. M4, the memory cover: an upper bound on the decoder layers a cluster can hold at once.

Every stage j holds n_j layers with at least one micro-batch in flight (eqs. M1, M2), so

    n_j <= floor((cap_o - fixed_o) / (static_o + act_o)) =: held_o                       (bytes per GPU)

and the stage uses d_o = num_gpus GPUs, spread over the groups of ``o.usage`` (a mixed option, eq. H1, over
several). With r_g = max_{o touching g} held_o / d_o (layers per GPU), sum_j n_j <= sum_g r_g * cap_g. The
stages holding the embedding and the LM head lose at least floor(extra_o / (static_o + act_o)) layers each
(floor(a - b) <= floor(a) - floor(b)), so the cover subtracts the least such loss over the options. A variant
whose cover is below L has no plan: presolve drops it before any search (a solver cannot prove that quickly:
the Lagrangian DPs give finite bounds on an empty problem, and the search splits tau until the time limit).
"""

from __future__ import annotations

import math

import numpy as np

from haap_milp.pipeline import memory_limit


def layers_per_gpu(options, var) -> dict[int, tuple[float, int]]:
    """Per group g: (r_g, the option attaining it) over the variant's allowed options."""
    best: dict[int, tuple[float, int]] = {}
    for i in np.flatnonzero(var.allowed):
        held = _held(var, int(i))
        ratio = held / options[i].num_gpus
        for g, _n in options[i].usage:
            if ratio > best.get(g, (-1.0, -1))[0]:
                best[g] = (ratio, int(i))
    return best


def extras_layers(var) -> int:
    """Layers the embedding and the LM head displace at least (the least loss over the allowed options)."""
    ok = np.flatnonzero(var.allowed)
    per_layer = var.layer_static_mem[ok] + var.layer_act_mem[ok]
    if not len(ok) or (per_layer <= 0).any():
        return 0
    first = np.floor((var.first_static_mem[ok] + var.first_act_mem[ok]) / per_layer)
    last = np.floor((var.last_static_mem[ok] + var.last_act_mem[ok]) / per_layer)
    return int(max(first.min(), 0) + max(last.min(), 0))


def cover(options, capacities, var) -> float:
    """Eq. M4: at most this many layers fit the cluster's memory under this variant."""
    best = layers_per_gpu(options, var)
    return sum(r * capacities[g] for g, (r, _i) in best.items()) - extras_layers(var)


def _held(var, i: int) -> float:
    per_layer = var.layer_static_mem[i] + var.layer_act_mem[i]
    room = memory_limit(var.mem_capacity[i]) - var.fixed_mem[i]
    return math.floor(room / per_layer) if per_layer > 0 else math.inf
