#!/usr/bin/env bash
# One setup entry point: creates .venv and installs the GPU stack (CUDA present) or the CPU stack.
# Idempotent: a second run with unchanged requirements only checks a stamp and returns in seconds.
#   OPENRLHF_CLASSMATE_STACK=cpu|gpu   force a stack (default: gpu if nvidia-smi sees a GPU)
#   PYTHON=python3.11                  interpreter used to create .venv
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
PYTHON="${PYTHON:-python3}"

stack="${OPENRLHF_CLASSMATE_STACK:-}"
if [ -z "$stack" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then stack=gpu; else stack=cpu; fi
fi
case "$stack" in cpu|gpu) ;; *) echo "setup.sh: OPENRLHF_CLASSMATE_STACK must be cpu or gpu, got '$stack'" >&2; exit 2;; esac

if [ "$stack" = gpu ]; then reqs=(requirements.txt); else reqs=(requirements-cpu.txt constraints-cpu.txt); fi
stamp_value="$stack $(cat "${reqs[@]}" pyproject.toml | sha256sum | cut -d' ' -f1)"
stamp=.venv/.setup_stamp
# CPU stack: DeepSpeed's C++ ops built once into .venv/torch_extensions, where the tests load them from (tests/conftest.py;
# openrlhf_classmate/testing/ds_ops.py says why), so that no test run compiles them inside its time
build_ops() {
  [ "$stack" = cpu ] || return 0
  if ls .venv/torch_extensions/{fused_adam,deepspeed_shm_comm,cpu_adam}/*.so >/dev/null 2>&1; then return 0; fi
  echo "setup.sh: building DeepSpeed's CPU ops (a few minutes, once)"
  DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR="$root/.venv/torch_extensions" .venv/bin/python -m openrlhf_classmate.testing.ds_ops
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_value" ] && .venv/bin/python -c "import openrlhf_classmate" 2>/dev/null; then
  build_ops
  echo "setup.sh: .venv is up to date ($stack stack)"
  exit 0
fi

echo "setup.sh: installing the $stack stack into .venv"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip=(.venv/bin/python -m pip install --disable-pip-version-check --progress-bar off)
if [ "$stack" = gpu ]; then
  # flash-attn builds against the installed torch, so torch goes first.
  "${pip[@]}" torch==2.13.0
  "${pip[@]}" --no-build-isolation -r requirements.txt
else
  "${pip[@]}" -r requirements-cpu.txt -c constraints-cpu.txt
  # openrlhf hard-requires flash-attn, which does not build without CUDA: install it alone.
  "${pip[@]}" --no-deps openrlhf==0.11.2
fi
"${pip[@]}" --no-deps -e .
build_ops
echo "$stamp_value" > "$stamp"
echo "setup.sh: done ($stack stack)"
