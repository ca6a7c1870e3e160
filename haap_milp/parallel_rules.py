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


def cp_divides_seq(seq_len: int, cp: int) -> bool:
    """Context parallelism splits each sequence into 2*cp chunks, rank r holding chunks r and 2cp-1-r, so that
    causal ring attention is load-balanced (Megatron-Core ``get_batch_on_this_cp_rank``; arguments.py:
    ``seq_length % (context_parallel_size * 2) == 0``). cp = 1 needs nothing."""
    return cp == 1 or (cp >= 1 and seq_len % (2 * cp) == 0)


def vpp_fills_rounds(num_layers: int, pp: int, vpp: int) -> bool:
    """Interleaving with vpp chunks per stage can hold a decoder layer in every virtual round (chunk c of the pp
    stages): stage j's chunk c holds a layer iff c < n_j, so some split must have a stage of >= vpp layers, and the
    deepest stage holds at most L - pp + 1 (every other stage at least one): vpp <= L - pp + 1. Past it every round
    from the (L - pp + 2)-th on relays each micro-batch through pp p2p hops with no layer anywhere, whatever the split.
    Not ceil(L / pp) (what every split fills): that drops plans whose deep stages fill the rounds (gpt3-13b x
    hetero3-4096's proven optimum: vpp 4 over 16 stages of 40 layers, three stages of 5). Megatron's even form
    (``--num-virtual-stages-per-pipeline-rank``) needs L % (pp * vpp) == 0, stricter; its
    ``--pipeline-model-parallel-layout`` allows empty chunks on some stages, as this rule does."""
    return vpp <= 1 or vpp <= num_layers - pp + 1


def etp_divides_ffn(expert_ffn: int, etp: int) -> bool:
    """Expert tensor parallelism splits each expert's FFN columns (fc1) and rows (fc2) etp ways."""
    return etp >= 1 and expert_ffn % etp == 0


def etp_fits_node(etp: int, gpus_per_node: int) -> bool:
    """An expert-tensor-parallel group stays inside one node, like tp (its all-gather / reduce-scatter of the
    routed tokens runs twice per pass and would otherwise sit on the NIC)."""
    return etp <= gpus_per_node


def expert_data_parallel(tp: int, dp: int, cp: int, ep: int, etp: int) -> int:
    """The expert-data-parallel size of a stage: its tp x cp x dp ranks regrouped as etp x ep x edp (Megatron-Core
    ``parallel_state.initialize_model_parallel``: ``expert_data_parallel_size = world_size // (pp * etp * ep)``
    per pipeline stage, i.e. tp*cp*dp / (etp*ep)); 0 when ep x etp does not fold onto the stage."""
    return (tp * dp * cp) // (ep * etp) if ep_fits_grid(tp, dp, cp, ep, etp) else 0
