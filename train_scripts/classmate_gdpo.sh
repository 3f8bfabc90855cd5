#!/usr/bin/env bash
# Classmate-CoT with GDPO, the main method (configs/classmate_gdpo.yaml).
#
#   train_scripts/classmate_gdpo.sh [launcher flags...]
#
# Environment: MODEL (WARMUP_MODEL = RUNS_DIR/warmup/final), CLASSMATE_MODEL (Qwen/Qwen3-0.6B), DATA / EVAL_DATA
# (helpful_instructions train / dev), OUTPUT_DIR (RUNS_DIR/classmate_gdpo), CLASSMATE_TP (1); the judge: JUDGE_URL or JUDGE_*
# (see warmup.sh); GPUs, Ray, DRY_RUN: lib.sh.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MODEL="${MODEL:-$WARMUP_MODEL}"
CLASSMATE_MODEL="${CLASSMATE_MODEL:-Qwen/Qwen3-0.6B}"
DATA="${DATA:-$DATA_ROOT/helpful_instructions/train.jsonl}"
EVAL_DATA="${EVAL_DATA-$DATA_ROOT/helpful_instructions/dev.jsonl}"

setup_gpus
use_classmate
use_judge
run_config classmate_gdpo "$@"
