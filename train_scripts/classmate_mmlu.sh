#!/usr/bin/env bash
# Classmate-CoT GDPO on MMLU-sycophancy (hint-letter reward) (configs/classmate_mmlu.yaml). No server needed.
#
#   train_scripts/classmate_mmlu.sh [launcher flags...]
#
# Environment: MODEL and CLASSMATE_MODEL (Qwen/Qwen3-0.6B), DATA / EVAL_DATA (setup_data/mmlu_sycophancy.py's train / dev),
# OUTPUT_DIR (RUNS_DIR/classmate_mmlu), CLASSMATE_TP (1); GPUs, Ray, DRY_RUN: lib.sh.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MODEL="${MODEL:-Qwen/Qwen3-0.6B}"
CLASSMATE_MODEL="${CLASSMATE_MODEL:-Qwen/Qwen3-0.6B}"
DATA="${DATA:-$DATA_ROOT/mmlu_sycophancy/train.jsonl}"
EVAL_DATA="${EVAL_DATA-$DATA_ROOT/mmlu_sycophancy/dev.jsonl}"

setup_gpus
use_classmate
run_config classmate_mmlu "$@"
