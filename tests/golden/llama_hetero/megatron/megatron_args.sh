# Megatron-LM arguments for this plan (haap), for Megatron-LM at d98e8a6 (megatron-core 0.16): the complete model definition
# of llama3-8b and the plan's parallelism; data, tokenizer and optimizer come from launch.sh.
# 2 stages: 0: 20 layers on h100-80g@main; 1: 12 layers on a100-80g@main
MEGATRON_ARGS=(
  --num-layers 32
  --hidden-size 4096
  --ffn-hidden-size 14336
  --num-attention-heads 32
  --kv-channels 128
  --group-query-attention
  --num-query-groups 8
  --seq-length 4096
  --max-position-embeddings 8192
  --normalization RMSNorm
  --norm-epsilon 1e-05
  --position-embedding-type rope
  --rotary-base 500000
  --swiglu
  --disable-bias-linear
  --untie-embeddings-and-output-weights
  --tensor-model-parallel-size 2
  --pipeline-model-parallel-size 2
  --pipeline-model-parallel-layout 'E,t*20|t*12,L'
  --micro-batch-size 1
  --global-batch-size 64
  --sequence-parallel
  --use-distributed-optimizer
  --bf16
  --recompute-granularity selective
)
