#!/usr/bin/env bash
# TinyV: GRPO on Big-Math with the TinyV verifier (configs/tinyv.yaml). Starts the verifier with `vllm serve`
# (as TinyV's run_grpo_tinyv.sh serves it: max-model-len 4096, 0.15 of the GPU memory next to training) unless TINYV_URL is set.
#
#   train_scripts/tinyv.sh [launcher flags...]
#
# Environment: MODEL (Qwen/Qwen2.5-7B), DATA / EVAL_DATA (setup_data/bigmath_tinyv.py's train / test), OUTPUT_DIR
# (RUNS_DIR/tinyv); the verifier: TINYV_URL, or TINYV_MODEL (zhangchenxu/TinyV-1.5B) / TINYV_PORT (8001) /
# TINYV_GPU_MEM / TINYV_TP / TINYV_DEVICES / TINYV_MAX_MODEL_LEN / TINYV_EXTRA_ARGS; TINYV_MODE (addon, tinyv_only,
# mixed) and TINYV_WEIGHT (TinyV's VERIFIER_SETUP / VERIFIER_WEIGHT); GPUs, Ray, DRY_RUN: lib.sh.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MODEL="${MODEL:-Qwen/Qwen2.5-7B}"
DATA="${DATA:-$DATA_ROOT/bigmath_tinyv/train.jsonl}"
EVAL_DATA="${EVAL_DATA-$DATA_ROOT/bigmath_tinyv/test.jsonl}"

setup_gpus
use_tinyv
run_config tinyv "$@"
