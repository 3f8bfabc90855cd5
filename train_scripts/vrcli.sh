#!/usr/bin/env bash
# VR-CLI: next-chapter prediction rewarded by the completion-likelihood improvement under the frozen reference model
# (configs/vrcli.yaml). No server: the generator is the run's reference model.
#
#   train_scripts/vrcli.sh [launcher flags...]
#
# Data first: setup_data/vrcli_story.py, then the baseline perplexities with the same MODEL:
#   python setup_data/vrcli_baseline_ppl.py --model "$MODEL" --in-place data/vrcli_story/*.jsonl
# (or pass --vrcli.baseline online to compute them during the run).
#
# Environment: MODEL (Qwen/Qwen2.5-3B-Instruct), DATA / EVAL_DATA (setup_data/vrcli_story.py's train / val), OUTPUT_DIR
# (RUNS_DIR/vrcli), VLLM_TP (1; the reference used 2); GPUs, Ray, DRY_RUN: lib.sh.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MODEL="${MODEL:-Qwen/Qwen2.5-3B-Instruct}"
DATA="${DATA:-$DATA_ROOT/vrcli_story/train.jsonl}"
EVAL_DATA="${EVAL_DATA-$DATA_ROOT/vrcli_story/val.jsonl}"

setup_gpus
run_config vrcli "$@"
