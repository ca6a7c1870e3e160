"""torchtitan config (haap) for torchtitan 0.3.0 (Python config registries: --module/--config): tiny-gqa on h100-a100.

Run: python -m torchtitan.train --module haap_torchtitan --config haap_plan  (this folder on PYTHONPATH;
launch.sh does it).
The model is tiny-gqa, built by haap_model() with torchtitan's own llama3 layer
builders (torchtitan/models/llama3/__init__.py:69-111) from the model's shapes;
parallelize / pipelining / hooks are those of its registry flavor '8B'.
RoPE without scaling (haap's model has none).
data_parallel_shard_degree = FSDP (shards weights and gradients too, beyond the plan's ZeRO-1 memory
model); each stage's ranks are placed by rank_map.json / launch.sh.
"""

import dataclasses

from torchtitan.config import ParallelismConfig
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # noqa: F401
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.llama3 import (
    _EMBEDDING_INIT,
    _NORM_INIT,
    Llama3Model,
    _build_llama3_layers,
    _output_linear_init,
    model_registry,
)
from torchtitan.models.llama3.config_registry import llama3_8b


def haap_model():
    """tiny-gqa: the shapes haap planned."""
    dim, vocab = 1024, 32000
    return Llama3Model.Config(
        dim=dim, vocab_size=vocab, enable_weight_tying=False,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, eps=1e-05, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_output_linear_init(dim)),
        layers=_build_llama3_layers(fuse_qkv=True, n_layers=8, dim=dim, n_heads=16, n_kv_heads=4,
                                    hidden_dim=4096, attn_backend="flex",
                                    rope=ComplexRoPE.Config(dim=64, max_seq_len=2048, theta=10000.0)),
    )


def haap_plan():
    config = llama3_8b()  # trainer components (optimizer, data loader, loss) of torchtitan
    config.model_spec = dataclasses.replace(model_registry('8B'), flavor='haap:tiny-gqa', model=haap_model())
    config.loss.loss_fn.global_vocab_size = decoder_vocab_size(config.model_spec)
    config.training.local_batch_size = 16
    config.training.global_batch_size = 64
    config.training.seq_len = 2048
    config.training.mixed_precision_param = "bfloat16"
    config.training.disable_cuda_graphs = True
    config.parallelism = ParallelismConfig(
        data_parallel_replicate_degree=1,
        data_parallel_shard_degree=4,
        tensor_parallel_degree=2,
        context_parallel_degree=1,
        pipeline_parallel_degree=2,
        pipeline_parallel_schedule='1F1B',
        pipeline_parallel_microbatch_size=2,
        module_fqns_per_model_part=[['tok_embeddings', 'layers.0', 'layers.1', 'layers.2', 'layers.3', 'layers.4'], ['layers.5', 'layers.6', 'layers.7', 'norm', 'lm_head']],
    )
    config.activation_checkpoint = None
    return config
