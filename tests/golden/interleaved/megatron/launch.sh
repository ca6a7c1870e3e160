#!/usr/bin/env bash
# Run on every node with HAAP_NODE set to its placeholder name (see hostfile
# and LAUNCH.txt).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
: "${MASTER_ADDR:?set MASTER_ADDR to the host of node rank 0}"
: "${MEGATRON_LM:?"set MEGATRON_LM to the path of a Megatron-LM checkout at the version above (pretrain_gpt.py runs from it)"}"
: "${DATA_PATH:?"set DATA_PATH to the Megatron indexed dataset prefix (tools/preprocess_data.py output, without .bin/.idx)"}"
: "${TOKENIZER_MODEL:?"set TOKENIZER_MODEL to a HuggingFace tokenizer name or folder whose vocabulary matches the model's"}"
: "${CHECKPOINT_DIR:?"set CHECKPOINT_DIR to a folder for checkpoints (--save and --load)"}"
NNODES=2
case "${HAAP_NODE:?}" in
  main-h100-80g-g0-n0) NODE_RANK=0; NPROC=4; export CUDA_VISIBLE_DEVICES=0,1,2,3 ;;
  main-a100-80g-g1-n0) NODE_RANK=1; NPROC=4; export CUDA_VISIBLE_DEVICES=0,1,2,3 ;;
  *) echo "unknown HAAP_NODE=$HAAP_NODE" >&2; exit 2 ;;
esac
[ -f "$HERE/nccl_env.sh" ] && source "$HERE/nccl_env.sh"
export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron: required with tp/cp > 1 (arguments.py)
source "$HERE/megatron_args.sh"
cd "$MEGATRON_LM"
torchrun --nnodes=$NNODES --node-rank=$NODE_RANK --nproc-per-node=$NPROC --rdzv-backend=static \
  --master-addr=$MASTER_ADDR --master-port=${MASTER_PORT:-6000} pretrain_gpt.py "${MEGATRON_ARGS[@]}" \
    --data-path "$DATA_PATH" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER_MODEL" \
    --save "$CHECKPOINT_DIR" --load "$CHECKPOINT_DIR" ${MEGATRON_EXTRA_ARGS:-}
