"""torchtitan config (haap) for torchtitan 0.3.0 (Python config registries: --module/--config): llama3-8b on h100-a100.

Run: python -m torchtitan.train --module haap_torchtitan --config haap_plan  (this folder on PYTHONPATH;
launch.sh does it).
The model is torchtitan's registry flavor llama3 8B, equal to llama3-8b on
every shape and architecture field (torchtitan/models/llama3/__init__.py:236-274).
data_parallel_shard_degree = FSDP (shards weights and gradients too, beyond the plan's ZeRO-1 memory
model); each stage's ranks are placed by rank_map.json / launch.sh.
"""

from torchtitan.config import ParallelismConfig
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # noqa: F401
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_8b


def haap_plan():
    config = llama3_8b()  # trainer components (optimizer, data loader, loss) of torchtitan
    config.model_spec = model_registry('8B')
    config.training.local_batch_size = 16
    config.training.global_batch_size = 64
    config.training.seq_len = 4096
    config.training.mixed_precision_param = "bfloat16"
    config.training.disable_cuda_graphs = True
    config.parallelism = ParallelismConfig(
        data_parallel_replicate_degree=1,
        data_parallel_shard_degree=4,
        tensor_parallel_degree=2,
        context_parallel_degree=1,
        pipeline_parallel_degree=2,
        pipeline_parallel_schedule='1F1B',
        pipeline_parallel_microbatch_size=1,
        module_fqns_per_model_part=[['tok_embeddings', 'layers.0', 'layers.1', 'layers.2', 'layers.3', 'layers.4', 'layers.5', 'layers.6', 'layers.7', 'layers.8', 'layers.9', 'layers.10', 'layers.11', 'layers.12', 'layers.13', 'layers.14', 'layers.15', 'layers.16', 'layers.17', 'layers.18', 'layers.19'], ['layers.20', 'layers.21', 'layers.22', 'layers.23', 'layers.24', 'layers.25', 'layers.26', 'layers.27', 'layers.28', 'layers.29', 'layers.30', 'layers.31', 'norm', 'lm_head']],
    )
    config.activation_checkpoint = SelectiveAC.Config()
    return config
