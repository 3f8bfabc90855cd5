#!/usr/bin/env bash
# Classmate-CoT GDPO on GSM8K (gsm8k scorer) (configs/classmate_gsm8k.yaml). No server needed.
#
#   train_scripts/classmate_gsm8k.sh [launcher flags...]
#
# Environment: MODEL and CLASSMATE_MODEL (Qwen/Qwen3-0.6B), DATA / EVAL_DATA (setup_data/gsm8k.py's train / test),
# OUTPUT_DIR (RUNS_DIR/classmate_gsm8k), CLASSMATE_TP (1); GPUs, Ray, DRY_RUN: lib.sh.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MODEL="${MODEL:-Qwen/Qwen3-0.6B}"
CLASSMATE_MODEL="${CLASSMATE_MODEL:-Qwen/Qwen3-0.6B}"
DATA="${DATA:-$DATA_ROOT/gsm8k/train.jsonl}"
EVAL_DATA="${EVAL_DATA-$DATA_ROOT/gsm8k/test.jsonl}"

setup_gpus
use_classmate
run_config classmate_gsm8k "$@"
