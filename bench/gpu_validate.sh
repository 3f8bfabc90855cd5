#!/usr/bin/env bash
# GPU validation and benchmarks on the lent GPU machine (results: bench/GPU_RESULTS.md). From the repository root:
#
#   bash bench/gpu_validate.sh STEP [STEP ...]
#
# Steps run in the order given; each writes its results under $OUT (default ./gpu_out) and prints a table:
#   install-wheels  pip-install $WHEELS (default .device_wheels: ../shared/tools/device_wheels/make_wheels.sh) into
#                   $WHEEL_SITE (default $HOME/site2): Ray, DeepSpeed, OpenRLHF and the rest of the trainer
#   prepare-bench   build the Qwen2.5-0.5B-shaped random models of the step-time benchmark (CPU work, no run)
#   stage-vllm-a    first half of the vLLM bundle (.vllm_bundle/a, ../shared/tools/device_vllm/) -> $VLLM_STAGE
#   install-vllm    second half (.vllm_bundle/b): join, check, install vLLM 0.26.0 into $VLLM_SITE ($HOME/site)
#   compile-sites   byte-compile both sites (python -m compileall), as pip does by default: both installs skip it
#                   (the bundle carries no .pyc), so without it every process compiles vLLM, Ray and DeepSpeed from
#                   source at import, on every import where PYTHONDONTWRITEBYTECODE is set (device.txt says)
#   coldstart       bench/cold_start.py (COLD_ARGS): launches of the 0.5B-shaped run, each after removing vLLM's and
#                   Triton's caches, alternating with and without the launcher's model inspection ahead of the
#                   engines; cold_start.json (two launches: ~460 s)
#   launcherprof    bench/launcher_profile.py (LAUNCHERPROF_ARGS, e.g. --model FOLDER): the launcher's parsing and
#                   preflight (`--check`) under cProfile, with every socket lookup timed; launcher_profile.json
#                   (--imports: each heavy package imported in a fresh process, the CUDA driver's start, and
#                   `-X importtime` of the same --check per package)
#   tests           the vLLM-touching test files against the real vLLM (pytest; count in tests.txt)
#   evaluate        bench/gpu_evaluate.py: cli.evaluate with the vLLM backend (main + classmate + monitor, fake judge)
#   vllm1 vllm1a vllm1b   bench/gpu_validate.py, one GPU, real vLLM engines (vllm1a/b: the plan split over 2 calls)
#   vllm2           bench/gpu_validate.py, two GPUs (share placement across GPUs; ZeRO-3 over both, colocated;
#                   classmate separate on GPU 1 beside colocate_all on GPU 0)
#   vllm3           the deployment shape, classmate placement separate: actor/ref, policy engine, classmate engine
#                   on a GPU each (3 GPUs: kind nvidia-h200-x4; skipped with the reason on fewer)
#   steptime1 steptime2   bench/step_time.py --gpus 1|2: GRPO vs classmate GDPO step-time breakdown (STEP_ARGS)
#   capacity        bench/capacity.py (CAP_ARGS, e.g. --cells 7b+1.5b/2k/2gpu,...): what fits where, a few
#                   classmate GDPO steps per cell of shapes x lengths x GPUs; capacity.json; resumable (finished cells
#                   are kept in $WORK/capacity): send it again until every cell has a row
#   hf (= validate) bench/gpu_validate.py with HF engines (the first GPU validation)
#   bench           bench/actor_update.py (BENCH_ARGS); all = validate + bench
#   lossbench       bench/loss_overhead.py (LOSS_ARGS): loss forward + backward per micro-batch vs the model's
#   packbench       bench/actor_update.py --ragged, packing off and on (PACK_ARGS)
#   vrclibench      bench/vrcli_reward.py (VRCLI_ARGS): VR-CLI reward forwards, batched vs per sample
#   chunkbench      bench/actor_update.py --chunked-logprobs (CHUNK_ARGS): stock vs --logprobs.chunked actor update
#                   (3 losses), reference forward, VR-CLI NLLs, LM head alone, at 0.5B 64 x (1k+1k); then
#                   --long-context (LONG_ARGS): 1.5B, 2 x 16k tokens, micro-batch 1 (trainer wheels only)
#   worldprobe      the GPU demo's warm start and held-out evaluation only (trainer wheels, no vLLM): CoT styles
#                   and their accuracies at warm start, in $OUT/world_probe/
#   prepared        bench/gpu_prepared_policy.py: vLLM loads a cli/prepare_policy folder (tags, log-probs, greedy
#                   tokens equal to transformers'); prepared_policy_vllm.json
#   genlogprobs     generation time of one rollout batch per log-prob request variant on a real vLLM
#                   engine (bench/vllm_generation_logprobs.py, GEN_ARGS), JSON in $OUT/vllm_generation_logprobs.json
#   gpudemo         python -m openrlhf_classmate.demo --gpu --compare-grpo (DEMO_ARGS), resumable in
#                   DEMO_OUT (default $WORK/gpu_demo) within what is left of BUDGET_S; send it again until it prints
#                   "gpudemo: done".
#                   Its artefacts come back in $OUT/gpu_demo/ (summary.md, summary.json, metrics.jsonl, curves.png,
#                   state.tar.gz: settings, stage markers and timings, evaluation rows, launcher logs and commands)
# Legacy form: `bash bench/gpu_validate.sh validate|bench|all [WHEEL_DIR]` installs WHEEL_DIR first.
#
# VALIDATE_RUNS (comma-separated run names of bench/gpu_validate.py) narrows a vllm1/vllm2/vllm3 step to those runs.
# BUDGET_S (default 570): seconds this call may take in all; the python steps skip runs that would not finish in
# what is left (a device call is killed at 600 s), so every call returns its JSON. Work files: $WORK
# (default $HOME/gpu_work; it survives between calls while the machine stays warm).
set -uo pipefail
T0=$(date +%s)
export OUT="${OUT:-$PWD/gpu_out}" WORK="${WORK:-$HOME/gpu_work}"
VLLM_SITE="${VLLM_SITE:-$HOME/site}" WHEEL_SITE="${WHEEL_SITE:-$HOME/site2}" WHEELS="${WHEELS:-.device_wheels}"
# the bundle's b/install.sh reads the first half from this fixed folder (../shared/tools/device_vllm/)
VLLM_STAGE=/root/vllm_bundle
BUDGET_S="${BUDGET_S:-570}"
mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/console.log") 2>&1

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(all)
if [ ${#steps[@]} -eq 2 ] && [[ " validate bench all " == *" ${steps[0]} "* ]] && [ -d "${steps[1]}" ]; then
  WHEELS="${steps[1]}" steps=(install-wheels "${steps[0]}")  # legacy: STEP WHEEL_DIR
fi
expanded=()
for step in "${steps[@]}"; do
  if [ "$step" = all ]; then expanded+=(validate bench); else expanded+=("$step"); fi
done
steps=("${expanded[@]}")

left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
need_vllm() {
  [ -f "$VLLM_SITE/vllm/__init__.py" ] && return 0
  echo "error: no vLLM in $VLLM_SITE: the machine is fresh; send the vLLM install calls (stage-vllm-a, install-vllm) again"
  exit 3
}
need_trainer() {
  python3 -c "import ray, deepspeed, openrlhf" 2>/dev/null && return 0
  echo "error: Ray/DeepSpeed/OpenRLHF not importable: send the install-wheels call again (carry $WHEELS)"
  exit 3
}
env_setup() {
  # both sites, even before the install steps of this call create them (a missing entry is harmless)
  export PYTHONPATH="$VLLM_SITE:$WHEEL_SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export VLLM_USE_FLASHINFER_SAMPLER=0  # flashinfer is not carried
  # DeepSpeed's JIT cannot parse arch suffixes such as the image's "9.0a": use the device's plain capability (asked
  # only where nvidia-smi sees a GPU: elsewhere the probe would only cost a torch import)
  local arch
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 \
    && arch="$(python3 -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))' 2>/dev/null)" \
    && export TORCH_CUDA_ARCH_LIST="$arch"
}
env_setup
{
  # the GPUs this call's processes see (CUDA_VISIBLE_DEVICES: two jobs on one host, a GPU each)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    ${CUDA_VISIBLE_DEVICES:+-i "$CUDA_VISIBLE_DEVICES"} 2>/dev/null || echo "no GPU"
  echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}; $(nproc) CPUs"
  python3 - <<'PY'
from importlib.metadata import PackageNotFoundError, version
import torch
def v(p):
    try:
        return version(p)
    except PackageNotFoundError:
        return "-"
print("torch", torch.__version__, "cuda", torch.version.cuda, *(f"| {p} {v(p)}" for p in
      ("transformers", "deepspeed", "ray", "openrlhf", "vllm")))
PY
  # whether imports compile from source (start-up: bench/GPU_RESULTS.md section 11)
  echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset}; .pyc files: $VLLM_SITE $(find "$VLLM_SITE" \
-name '*.pyc' 2>/dev/null | wc -l), $WHEEL_SITE $(find "$WHEEL_SITE" -name '*.pyc' 2>/dev/null | wc -l)"
} > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

status=0
for step in "${steps[@]}"; do
  echo "===== $step ($(left) s of BUDGET_S left)"
  if [ "$(left)" -lt 30 ] && [[ "$step" != install-* && "$step" != stage-* ]]; then
    echo "skipped: BUDGET_S used up"; status=1; continue
  fi
  case "$step" in
    install-wheels)
      if [ -f "$WHEEL_SITE/.installed" ]; then echo "wheels already in $WHEEL_SITE"
      else
        ls "$WHEELS"/*.whl >/dev/null || { echo "error: no wheels in $WHEELS"; exit 3; }
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WHEEL_SITE" \
          "$WHEELS"/*.whl && touch "$WHEEL_SITE/.installed" || exit 3
      fi ;;
    stage-vllm-a)
      mkdir -p "$VLLM_STAGE" && cp .vllm_bundle/a/* "$VLLM_STAGE"/ && ls -la "$VLLM_STAGE" || exit 3 ;;
    install-vllm)
      bash .vllm_bundle/b/install.sh "$VLLM_SITE" || exit 3 ;;
    compile-sites)
      for site in "$VLLM_SITE" "$WHEEL_SITE"; do
        [ -d "$site" ] || continue
        t=$(date +%s)
        python3 -m compileall -q -j 0 "$site" >/dev/null 2>&1
        echo "$site: $(find "$site" -name '*.pyc' | wc -l) .pyc files ($(( $(date +%s) - t )) s)"
      done ;;
    prepare-bench)
      python3 bench/step_time.py --prepare-only || status=1 ;;
    coldstart)
      need_vllm; need_trainer
      # shellcheck disable=SC2086
      python3 bench/cold_start.py --out "$OUT" --work "$WORK/cold_start" --models "$WORK/step_time_models" \
        --budget-s "$(left)" ${COLD_ARGS:-} || status=1 ;;
    launcherprof)
      need_vllm; need_trainer
      # shellcheck disable=SC2086
      timeout "$(left)" python3 bench/launcher_profile.py --out "$OUT" ${LAUNCHERPROF_ARGS:-} || status=1 ;;
    tests)
      need_vllm; need_trainer
      # the real vLLM's Python API under the CPU test suite (tests/conftest.py: DeepSpeed on its CPU accelerator)
      timeout "$(left)" python3 -m pytest -q -p no:cacheprovider \
        tests/test_sampling_params.py tests/test_shims.py tests/test_evaluate.py tests/test_hf_engine.py \
        tests/test_vllm_engine_counter.py tests/test_upstream_pins.py tests/test_trainer.py \
        tests/test_classmate_finish_reasons.py tests/test_launcher_args.py tests/test_experience_maker.py \
        2>&1 | tee "$OUT/tests.txt" | tail -25
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    evaluate)
      need_vllm
      python3 bench/gpu_evaluate.py --out "$OUT" --budget-s "$(left)" || status=1 ;;
    vllm1|vllm2|vllm3|hf|validate|vllm1a|vllm1b)
      need_trainer
      case "$step" in
        vllm1a) sel=(--runs zero2_separated_colocate --name vllm1a) ;;
        vllm1b) sel=(--runs zero3_gdpo_share,zero3_vanilla_colocate --name vllm1b) ;;
        validate) sel=(--plan hf --name validate) ;;
        *) sel=(--plan "$step") ;;
      esac
      # VALIDATE_RUNS=a,b: only these runs of the step's plan (e.g. the ones an earlier session did not run)
      [ -n "${VALIDATE_RUNS:-}" ] && sel=(--runs "$VALIDATE_RUNS" --name "$step")
      [ "$step" = hf ] || [ "$step" = validate ] || need_vllm
      if [ "$step" = hf ] || [ "$step" = validate ]; then
        export RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0  # HF engines (num_gpus=0) must still see the GPU
      fi
      python3 bench/gpu_validate.py "${sel[@]}" --out "$OUT" --budget-s "$(left)" || status=1
      unset RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO ;;
    steptime1|steptime2)
      need_vllm; need_trainer
      # shellcheck disable=SC2086
      python3 bench/step_time.py --gpus "${step#steptime}" --out "$OUT" --budget-s "$(left)" ${STEP_ARGS:-} \
        || status=1 ;;
    capacity)
      need_vllm; need_trainer
      # shellcheck disable=SC2086
      python3 bench/capacity.py --out "$OUT" --work "$WORK/capacity" --models "$WORK/capacity_models" \
        --budget-s "$(left)" ${CAP_ARGS:-} || status=1 ;;
    lossbench)
      # loss forward + backward per micro-batch vs the model's (CUDA events)
      python3 bench/loss_overhead.py --out "$OUT/loss_overhead.json" ${LOSS_ARGS:-} || status=1 ;;
    packbench)
      # actor update, stock vs both classmate losses, packing off and on (ragged responses)
      need_trainer
      for packing in "" "--packing"; do
        name=actor_update_ragged${packing:+_packed}
        # shellcheck disable=SC2086
        timeout "$(left)" python3 bench/actor_update.py --ragged $packing --out "$OUT/$name.json" ${PACK_ARGS:-} 2>&1 \
          | grep -vE "Train epoch|it/s" || status=1
      done ;;
    vrclibench)
      # VR-CLI reward forwards, batched vs one call per sample
      need_trainer
      # shellcheck disable=SC2086
      timeout "$(left)" python3 bench/vrcli_reward.py --out "$OUT" ${VRCLI_ARGS:-} || status=1 ;;
    chunkbench)
      need_trainer
      # chunked log-probs: the 0.5B comparison gets what is left minus ~150 s for the long-context run
      # shellcheck disable=SC2086
      timeout "$(left)" python3 bench/actor_update.py --chunked-logprobs --budget-s "$(( $(left) - 180 ))" \
        --out "$OUT/chunked_actor_update.json" ${CHUNK_ARGS:-} 2>&1 | grep -vE "Train epoch|it/s"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      # shellcheck disable=SC2086
      timeout "$(left)" python3 bench/actor_update.py --chunked-logprobs --long-context --budget-s "$(( $(left) - 20 ))" \
        --out "$OUT/chunked_long_context.json" ${LONG_ARGS:-} 2>&1 | grep -vE "Train epoch|it/s"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    bench)
      need_trainer
      # shellcheck disable=SC2086
      python3 bench/actor_update.py --out "$OUT/actor_update.json" ${BENCH_ARGS:-} 2>&1 | grep -vE "Train epoch|it/s" \
        || status=1 ;;
    worldprobe)
      # the GPU demo's warm start and its held-out evaluation (HF backend), nothing else: which CoT styles the warm
      # start writes and how accurate each is (a world change is checked here before a whole demo run)
      need_trainer
      probe="$WORK/world_probe"
      for stage in warmstart eval_before; do
        python3 -m openrlhf_classmate.demo --gpu --eval-backend hf --output-dir "$probe" --_stage "$stage" \
          || { echo "worldprobe: $stage failed"; status=1; break; }
      done
      mkdir -p "$OUT/world_probe"
      cp -r "$probe/stages" "$OUT/world_probe/" 2>/dev/null
      [ -f "$probe/eval_before.jsonl" ] && gzip -c "$probe/eval_before.jsonl" > "$OUT/world_probe/eval_before.jsonl.gz"
      ;;
    prepared)
      # vLLM loads a folder that cli/prepare_policy wrote (think tags added as tokens) and sees what transformers sees
      need_vllm; need_trainer
      timeout "$(left)" python3 bench/gpu_prepared_policy.py --out "$OUT" || status=1 ;;
    genlogprobs)
      need_vllm; need_trainer
      # shellcheck disable=SC2086
      timeout "$(left)" python3 bench/vllm_generation_logprobs.py --out "$OUT/vllm_generation_logprobs.json" \
        ${GEN_ARGS:-} || status=1 ;;
    gpudemo)
      need_vllm; need_trainer
      demo="${DEMO_OUT:-$WORK/gpu_demo}"
      # shellcheck disable=SC2086
      python3 -m openrlhf_classmate.demo --gpu --compare-grpo --output-dir "$demo" --budget-s "$(( $(left) - 20 ))" \
        ${DEMO_ARGS:-}
      rc=$?
      case $rc in
        0) echo "gpudemo: done (results in $OUT/gpu_demo)" ;;
        75) echo "gpudemo: not finished: send 'bash bench/gpu_validate.sh gpudemo' again (the machine must stay warm)" ;;
        *) echo "gpudemo: failed (exit $rc)"; status=1 ;;
      esac
      mkdir -p "$OUT/gpu_demo"
      for f in summary.md summary.json metrics.jsonl curves.png; do
        [ -f "$demo/$f" ] && cp "$demo/$f" "$OUT/gpu_demo/"
      done
      if [ -d "$demo" ]; then
        (cd "$demo" && find . -maxdepth 3 \( -name settings.json -o -path ./stages/\* -o -name 'eval_*.jsonl' \
          -o -name launcher.log -o -name command.txt -o -name steps.jsonl \) -type f -print0 \
          | tar czf "$OUT/gpu_demo/state.tar.gz" --null -T -)
      fi ;;
    *)
      echo "error: unknown step '$step' (see the header of bench/gpu_validate.sh)"; exit 2 ;;
  esac
done
echo "===== done in $(( $(date +%s) - T0 )) s, status $status"
exit $status
