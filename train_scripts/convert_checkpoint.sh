#!/usr/bin/env bash
# DeepSpeed ZeRO checkpoint of a run -> Hugging Face model directory (zero_to_fp32, config / generation config /
# tokenizer / chat template from the base model, optional bf16 cast, verified by a forward-pass comparison).
#
#   train_scripts/convert_checkpoint.sh CKPT_DIR OUT_DIR [TAG] [more flags of the Python entry point...]
#
# CKPT_DIR: the run's --ckpt.path (e.g. runs/classmate_gdpo/ckpt) or its _actor folder; TAG: global_stepN (default:
# the checkpoint's `latest`). More flags: --base-model PATH, --dtype bf16|fp32, --push-to-hub REPO, --no-verify, ...
# (python -m openrlhf_classmate.cli.convert_checkpoint --help). PYTHON picks the interpreter (default: the repo's
# .venv, else python3).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if (($# < 2)); then
  sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
ckpt=$1 out=$2
shift 2
tag=()
if (($# > 0)) && [[ "$1" != -* ]]; then
  tag=(--tag "$1")
  shift
fi
exec "$PYTHON" -m openrlhf_classmate.cli.convert_checkpoint "$ckpt" "$out" "${tag[@]}" "$@"
