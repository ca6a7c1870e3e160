"""Built-in GPUs, models and clusters (YAML package data) and the loaders for user inputs.

Public API::

    load_gpu(name) -> GPUSpec            # 'a100-80g', case-insensitive, aliases, "did you mean"
    load_model(text) -> ModelSpec        # catalog name | HF config.json (or its directory) | YAML/JSON file
    load_cluster(text) -> ClusterSpec    # catalog name | YAML/JSON file | 'a100-80g:64,v100-32g:32/8@roce'
    gpu_names(), model_names(), cluster_names() -> list[str]
    DEFAULT_MODEL, DEFAULT_CLUSTER       # what `haap-solve solve` plans with no arguments

All user mistakes raise ``haap_milp.errors.HaapInputError`` (one paragraph, field and value).

Defaults, chosen deliberately: ``llama3-8b`` (a current GQA/SwiGLU model, 32 layers, 8.0B
parameters) on ``h100-a100-32`` (2 DGX H100 + 2 DGX A100-80GB, one InfiniBand fabric).
Both GPU types support bf16 (the TrainingSpec default precision), memory is equal (80 GiB)
and compute differs 3.2x (989 vs 312 dense TF/s), so the optimal plan is visibly
heterogeneous (more layers on the H100 stages) while 32 GPUs of 2 types keep the search
small enough to plan in seconds. V100 mixes were rejected as the default because V100
lacks bf16.
"""

from __future__ import annotations

from haap_milp.catalog.data import cluster_names, gpu_names, model_names
from haap_milp.catalog.loaders import load_cluster, load_gpu, load_model

DEFAULT_MODEL = "llama3-8b"
DEFAULT_CLUSTER = "h100-a100-32"

__all__ = [
    "DEFAULT_CLUSTER",
    "DEFAULT_MODEL",
    "cluster_names",
    "gpu_names",
    "load_cluster",
    "load_gpu",
    "load_model",
    "model_names",
]
