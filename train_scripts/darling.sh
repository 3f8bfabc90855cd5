#!/usr/bin/env bash
# DARLING (math): diversity-aware GRPO on DeepScaleR (configs/darling.yaml). Starts DARLING_NUM_SERVERS pair-classifier
# servers (`vllm serve DARLING_CLASSIFIER_MODEL --runner pooling`, one GPU each) unless DARLING_CLASSIFIER_URLS is
# set, and passes their URLs to the run (--darling.classifier_urls). DARLING itself (partition diversity x math-verify
# quality, dr_grpo) is configured in the config's darling: section.
#
#   train_scripts/darling.sh [launcher flags...]
#
# Environment: MODEL (Qwen/Qwen3-4B-Base), DATA / EVAL_DATA (setup_data/deepscaler.py's train / test), OUTPUT_DIR
# (RUNS_DIR/darling); the classifier: DARLING_CLASSIFIER_URLS (comma-separated), or DARLING_CLASSIFIER_MODEL (required
# then; no public checkpoint) / DARLING_NUM_SERVERS (1) / DARLING_PORT (8010, then +1 per server) / DARLING_GPU_MEM /
# DARLING_MAX_MODEL_LEN / DARLING_EXTRA_ARGS; GPUs, Ray, DRY_RUN: lib.sh.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MODEL="${MODEL:-Qwen/Qwen3-4B-Base}"
DATA="${DATA:-$DATA_ROOT/deepscaler/train.jsonl}"
EVAL_DATA="${EVAL_DATA-$DATA_ROOT/deepscaler/test.jsonl}"

setup_gpus
use_darling_classifiers
run_config darling "$@"
