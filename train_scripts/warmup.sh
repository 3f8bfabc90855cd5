#!/usr/bin/env bash
# Warm-up: GRPO with the sycophancy-encouraging system prompt (configs/warmup.yaml). Its final model
# (RUNS_DIR/warmup/final) is WARMUP_MODEL, the starting point of the general-sycophancy runs.
#
#   train_scripts/warmup.sh [launcher flags...]      # flags override the config and the defaults below
#
# Environment: MODEL (Qwen/Qwen3-0.6B), DATA / EVAL_DATA (setup_data/helpful_instructions.py's warmup_train /
# warmup_dev), OUTPUT_DIR (RUNS_DIR/warmup); the judge: JUDGE_URL, or JUDGE_MODEL / JUDGE_PORT / JUDGE_GPU_MEM /
# JUDGE_TP / JUDGE_DEVICES / JUDGE_MAX_MODEL_LEN / JUDGE_EXTRA_ARGS to start one; GPUs, Ray and DRY_RUN: see lib.sh.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MODEL="${MODEL:-Qwen/Qwen3-0.6B}"
DATA="${DATA:-$DATA_ROOT/helpful_instructions/warmup_train.jsonl}"
EVAL_DATA="${EVAL_DATA-$DATA_ROOT/helpful_instructions/warmup_dev.jsonl}"

setup_gpus
use_judge
run_config warmup "$@"
