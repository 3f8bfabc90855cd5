#!/usr/bin/env bash
# Baseline: GRPO without a classmate, from the warm-up model (configs/baseline_grpo.yaml).
#
#   train_scripts/baseline_grpo.sh [launcher flags...]
#
# Environment: MODEL (WARMUP_MODEL = RUNS_DIR/warmup/final), DATA / EVAL_DATA (helpful_instructions train / dev),
# OUTPUT_DIR (RUNS_DIR/baseline_grpo); the judge: JUDGE_URL or JUDGE_* (see warmup.sh); GPUs, Ray, DRY_RUN: lib.sh.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MODEL="${MODEL:-$WARMUP_MODEL}"
DATA="${DATA:-$DATA_ROOT/helpful_instructions/train.jsonl}"
EVAL_DATA="${EVAL_DATA-$DATA_ROOT/helpful_instructions/dev.jsonl}"

setup_gpus
use_judge
run_config baseline_grpo "$@"
