#!/usr/bin/env bash
# Classmate-CoT GDPO on coding tasks (code / code_stdio scorers) (configs/classmate_code.yaml). Starts the
# code-execution sandbox (python -m openrlhf_classmate.sandbox) unless SANDBOX_URL is set, waits for its /health and
# stops it on exit. Run as root for the sandbox's full isolation (namespaces, a uid per slot, cgroups); otherwise it
# falls back to a user namespace, or to rlimits only, and says so in its log and at /health.
#
#   train_scripts/classmate_code.sh [launcher flags...]
#
# Environment: MODEL and CLASSMATE_MODEL (Qwen/Qwen3-0.6B), DATA / EVAL_DATA (DATA_ROOT/code/{train,test}.jsonl, rows
# as in setup_data/README.md), OUTPUT_DIR (RUNS_DIR/classmate_code), CLASSMATE_TP (1); the sandbox: SANDBOX_URL, or
# SANDBOX_PORT (8001) / SANDBOX_ARGS (extra service flags, e.g. "--max-concurrency 32 --memory-mb 2048");
# CODE_REWARD (fraction | all_or_nothing); GPUs, Ray, DRY_RUN: lib.sh.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

RUN_NAME="${RUN_NAME:-classmate_code}"
MODEL="${MODEL:-Qwen/Qwen3-0.6B}"
CLASSMATE_MODEL="${CLASSMATE_MODEL:-Qwen/Qwen3-0.6B}"
DATA="${DATA:-$DATA_ROOT/code/train.jsonl}"
EVAL_DATA="${EVAL_DATA-$DATA_ROOT/code/test.jsonl}"

setup_gpus
use_classmate
use_sandbox
run_config classmate_code "$@"
