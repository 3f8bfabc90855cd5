#!/usr/bin/env bash
# Classmate-CoT GDPO on MATH (hendrycks_math, math-verify scorer) (configs/classmate_math.yaml). No server needed.
#
#   train_scripts/classmate_math.sh [launcher flags...]
#
# Environment: MODEL and CLASSMATE_MODEL (Qwen/Qwen3-0.6B), DATA / EVAL_DATA (setup_data/hendrycks_math.py's train / test),
# OUTPUT_DIR (RUNS_DIR/classmate_math), CLASSMATE_TP (1); GPUs, Ray, DRY_RUN: lib.sh.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MODEL="${MODEL:-Qwen/Qwen3-0.6B}"
CLASSMATE_MODEL="${CLASSMATE_MODEL:-Qwen/Qwen3-0.6B}"
DATA="${DATA:-$DATA_ROOT/hendrycks_math/train.jsonl}"
EVAL_DATA="${EVAL_DATA-$DATA_ROOT/hendrycks_math/test.jsonl}"

setup_gpus
use_classmate
run_config classmate_math "$@"
