"""Which parallel degrees a model and a node admit (a leaf module: plain ints in, answers out).

One definition of each divisibility rule, used by presolve (what to enumerate), the estimator (what it
refuses to price), check, explain and the emitters (what the engines accept). Sources: Megatron-LM
``transformer_config.py`` (num_attention_heads % tp == 0, num_query_groups % tp == 0) and its expert
grid (ep x etp divides the stage's tp x dp x cp ranks); tensor parallelism stays inside a node (NVLink).
"""

from __future__ import annotations


def tp_head_misfits(num_heads: int, kv_heads: int, tp: int) -> list[str]:
    """Which head counts tp fails to divide: a sublist of ["heads", "kv_heads"] (empty: tp is fine)."""
    return [name for name, n in (("heads", num_heads), ("kv_heads", kv_heads)) if n % tp]


def tp_divides_heads(num_heads: int, kv_heads: int, tp: int) -> bool:
    """tp divides the attention heads and the key/value heads (query groups)."""
    return not tp_head_misfits(num_heads, kv_heads, tp)


def tp_fits_node(tp: int, gpus_per_node: int) -> bool:
    """A tensor-parallel group stays inside one node."""
    return tp <= gpus_per_node


def tp_allowed(num_heads: int, kv_heads: int, tp: int, gpus_per_node: int) -> bool:
    """The tp rule: tp divides heads and kv heads and fits a node."""
    return tp_fits_node(tp, gpus_per_node) and tp_divides_heads(num_heads, kv_heads, tp)


def ep_divides_experts(num_experts: int, ep: int) -> bool:
    """Every expert-parallel rank holds the same number of experts."""
    return num_experts % ep == 0


def ep_fits_grid(tp: int, dp: int, cp: int, ep: int, etp: int = 1) -> bool:
    """The expert grid ep x etp folds onto the stage's tp x dp x cp ranks (Megatron's expert grid)."""
    return (tp * dp * cp) % (ep * etp) == 0
