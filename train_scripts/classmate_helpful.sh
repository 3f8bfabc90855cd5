#!/usr/bin/env bash
# Classmate-CoT on helpful_instructions, rated by the LLM judge, with one of three configs:
#
#   train_scripts/classmate_helpful.sh CONFIG [launcher flags...]
#
#   classmate_gdpo                  GDPO, the main method (also train_scripts/classmate_gdpo.sh)
#   classmate_separated             separated advantages and the two-term loss
#   classmate_reproduce_reference   the reference run: vanilla_classmate loss, seq-mean-token-sum-norm, no std
#                                   normalisation, the reference hyper-parameters
# (each configs/CONFIG.yaml).
#
# Environment: MODEL (WARMUP_MODEL = RUNS_DIR/warmup/final), CLASSMATE_MODEL (Qwen/Qwen3-0.6B), DATA / EVAL_DATA
# (helpful_instructions train / dev), OUTPUT_DIR (RUNS_DIR/CONFIG), CLASSMATE_TP (1); the judge: JUDGE_URL or JUDGE_*
# (see warmup.sh); GPUs, Ray, DRY_RUN: lib.sh.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

config="${1:-}"
case "$config" in
  classmate_gdpo | classmate_separated | classmate_reproduce_reference) shift ;;
  *) die "usage: train_scripts/classmate_helpful.sh classmate_gdpo|classmate_separated|classmate_reproduce_reference [launcher flags...] (got '$config')" ;;
esac

MODEL="${MODEL:-$WARMUP_MODEL}"
CLASSMATE_MODEL="${CLASSMATE_MODEL:-Qwen/Qwen3-0.6B}"
DATA="${DATA:-$DATA_ROOT/helpful_instructions/train.jsonl}"
EVAL_DATA="${EVAL_DATA-$DATA_ROOT/helpful_instructions/dev.jsonl}"

setup_gpus
use_classmate
use_judge
run_config "$config" "$@"
