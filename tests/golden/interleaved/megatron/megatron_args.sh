# Megatron-LM arguments for this plan (haap), for Megatron-LM at d98e8a6 (megatron-core 0.16): the complete model definition
# of tiny-gqa and the plan's parallelism; data, tokenizer and optimizer come from launch.sh.
# 4 stages: 0: 3 layers on h100-80g@main; 1: 3 layers on h100-80g@main; 2: 1 layers on a100-80g@main; 3: 1 layers on a100-80g@main
MEGATRON_ARGS=(
  --num-layers 8
  --hidden-size 1024
  --ffn-hidden-size 4096
  --num-attention-heads 16
  --kv-channels 64
  --group-query-attention
  --num-query-groups 4
  --seq-length 2048
  --max-position-embeddings 2048
  --normalization RMSNorm
  --norm-epsilon 1e-05
  --position-embedding-type rope
  --rotary-base 10000
  --swiglu
  --disable-bias-linear
  --untie-embeddings-and-output-weights
  --tensor-model-parallel-size 1
  --pipeline-model-parallel-size 4
  --pipeline-model-parallel-layout 'E,t*2|t*2|t|t|t|t||L'
  --micro-batch-size 1
  --global-batch-size 16
  --use-distributed-optimizer
  --bf16
  --recompute-granularity full
  --recompute-method uniform
  --recompute-num-layers 1
)
