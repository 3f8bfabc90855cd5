#!/usr/bin/env bash
# Self-classmate: Classmate-CoT GDPO whose classmate is a frozen copy of the warm-up model the policy starts from
# (configs/self_classmate.yaml).
#
#   train_scripts/self_classmate.sh [launcher flags...]
#
# Environment: WARMUP_MODEL (RUNS_DIR/warmup/final) for both MODEL and CLASSMATE_MODEL, DATA / EVAL_DATA
# (helpful_instructions train / dev), OUTPUT_DIR (RUNS_DIR/self_classmate); the judge: JUDGE_URL or JUDGE_* (see
# warmup.sh); GPUs, Ray, DRY_RUN: lib.sh.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MODEL="${MODEL:-$WARMUP_MODEL}"
CLASSMATE_MODEL="${CLASSMATE_MODEL:-$MODEL}"
DATA="${DATA:-$DATA_ROOT/helpful_instructions/train.jsonl}"
EVAL_DATA="${EVAL_DATA-$DATA_ROOT/helpful_instructions/dev.jsonl}"

setup_gpus
use_classmate
use_judge
run_config self_classmate "$@"
