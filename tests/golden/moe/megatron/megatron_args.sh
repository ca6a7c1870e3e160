# Megatron-LM arguments for this plan (haap), for Megatron-LM at d98e8a6 (megatron-core 0.16): the complete model definition
# of tiny-moe and the plan's parallelism; data, tokenizer and optimizer come from launch.sh.
# 2 stages: 0: 4 layers on a100-80g@main; 1: 4 layers on a100-80g@main
MEGATRON_ARGS=(
  --num-layers 8
  --hidden-size 1024
  --ffn-hidden-size 4096
  --num-attention-heads 16
  --kv-channels 64
  --seq-length 2048
  --max-position-embeddings 2048
  --normalization RMSNorm
  --norm-epsilon 1e-05
  --position-embedding-type rope
  --rotary-base 10000
  --swiglu
  --disable-bias-linear
  --untie-embeddings-and-output-weights
  --tensor-model-parallel-size 2
  --pipeline-model-parallel-size 2
  --micro-batch-size 1
  --global-batch-size 32
  --sequence-parallel
  --use-distributed-optimizer
  --bf16
  --num-experts 8
  --moe-router-topk 2
  --moe-ffn-hidden-size 1024
  --expert-model-parallel-size 4
  --expert-tensor-parallel-size 1
  --moe-token-dispatcher-type alltoall
  --moe-router-score-function softmax
  --moe-router-load-balancing-type none
  --moe-layer-freq '[0,1,0,1,0,1,0,1]'
)
