#!/usr/bin/env bash
# GPU validation on one GPU (see bench/GPU_RESULTS.md). Usage, from the repository root:
#   bash bench/gpu_validate.sh [validate|bench|all] [WHEEL_DIR]
# validate: the CPU end-to-end classmate run on the GPU (ZeRO-2 separated, ZeRO-3 gdpo; 3 steps; checkpoint, HF save,
#           conversion); bench: bench/actor_update.py (0.5B actor update, stock vs classmate losses).
# WHEEL_DIR (optional): wheels to install first into $SITE (the lent machine has no internet; see
# ../shared/tools/device_wheels/README.md). Results go to $OUT (default ./gpu_out); BENCH_ARGS are passed to
# bench/actor_update.py (e.g. BENCH_ARGS="--repeats 16").
set -euo pipefail
what="${1:-all}"
wheels="${2:-}"
export OUT="${OUT:-$PWD/gpu_out}" SITE="${SITE:-$HOME/.cache/openrlhf_classmate/site}"
mkdir -p "$OUT"
if [ -n "$wheels" ] && [ ! -f "$SITE/.installed" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$wheels"/*.whl
  touch "$SITE/.installed"
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# DeepSpeed's JIT cannot parse arch suffixes such as the image's "9.0a": use the device's plain capability
TORCH_CUDA_ARCH_LIST="$(python3 -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))')"
export TORCH_CUDA_ARCH_LIST
export RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0                  # HF engines (num_gpus=0) must still see the GPU
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt" || true
python3 - <<'PY' | tee -a "$OUT/device.txt"
from importlib.metadata import version
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, *(f"| {p} {version(p)}" for p in
      ("transformers", "deepspeed", "ray", "openrlhf")))
PY
status=0
if [ "$what" = validate ] || [ "$what" = all ]; then
  python3 bench/gpu_validate.py --out "$OUT" 2>&1 | tee "$OUT/validate.log" | grep -E "^(run|ZeRO)|Error|error:" || status=1
  tail -4 "$OUT/validate.log"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 bench/actor_update.py --out "$OUT/actor_update.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | grep -vE "Train epoch|it/s" || status=1
fi
exit $status
