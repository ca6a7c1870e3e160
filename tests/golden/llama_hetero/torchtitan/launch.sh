#!/usr/bin/env bash
# Run on every node with HAAP_NODE set to its placeholder name (see hostfile
# and LAUNCH.txt).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
: "${MASTER_ADDR:?set MASTER_ADDR to the host of node rank 0}"
: "${TORCHTITAN:?"set TORCHTITAN to the path of a torchtitan checkout (or an install) at the version above"}"
: "${HF_ASSETS_PATH:?"set HF_ASSETS_PATH to the model's HuggingFace tokenizer folder (--hf_assets_path)"}"
: "${DATASET:?"set DATASET to a torchtitan dataset name or a HuggingFace dataset (--dataloader.dataset)"}"
: "${DUMP_FOLDER:?"set DUMP_FOLDER to a folder for checkpoints and logs (--dump_folder)"}"
NNODES=2
case "${HAAP_NODE:?}" in
  main-h100-80g-g0-n0) NODE_RANK=0; NPROC=8; export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 ;;
  main-a100-80g-g1-n0) NODE_RANK=1; NPROC=8; export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 ;;
  *) echo "unknown HAAP_NODE=$HAAP_NODE" >&2; exit 2 ;;
esac
[ -f "$HERE/nccl_env.sh" ] && source "$HERE/nccl_env.sh"
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
cd "$TORCHTITAN"
torchrun --nnodes=$NNODES --node-rank=$NODE_RANK --nproc-per-node=$NPROC --rdzv-backend=static \
  --master-addr=$MASTER_ADDR --master-port=${MASTER_PORT:-6000} -m torchtitan.train --module haap_torchtitan --config haap_plan \
    --hf_assets_path "$HF_ASSETS_PATH" --dataloader.dataset "$DATASET" --dump_folder "$DUMP_FOLDER" ${TORCHTITAN_EXTRA_ARGS:-}
