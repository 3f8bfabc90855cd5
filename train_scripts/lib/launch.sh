# shellcheck shell=bash
# The launch: preflight, then the launcher, directly or as a Ray job (sourced by train_scripts/lib.sh).

# ── launch ─────────────────────────────────────────────────────────────────────────────────────────────────────

# runtime_env_json: the Ray job's runtime env: this repository as working_dir (large folders excluded) and the
# forwarded environment variables.
# Only the listed variables travel: the job runs on other machines, where this shell's PATH or CUDA_VISIBLE_DEVICES
# would be wrong.
runtime_env_json() {
  local names="HF_HOME HF_HUB_OFFLINE HF_ENDPOINT TRANSFORMERS_OFFLINE WANDB_MODE NCCL_DEBUG ${RAY_JOB_ENV_VARS:-}"
  # shellcheck disable=SC2086  # word splitting wanted: one argument per name
  _helper ray-runtime-env "$REPO_ROOT" $names
}

# launch FLAGS...: run the launcher with FLAGS, directly or as a Ray job (RAY_ADDRESS); returns its exit status.
launch() {
  local cmd=()
  if [[ -n "${RAY_ADDRESS:-}" ]] && switch_on RAY_SUBMIT 1; then
    local ray_bin="${RAY_BIN:-}"
    if [[ -z "$ray_bin" ]]; then
      if [[ "$PYTHON" == */* && -x "$(dirname "$PYTHON")/ray" ]]; then ray_bin="$(dirname "$PYTHON")/ray"; else ray_bin=ray; fi
    fi
    cmd=("$ray_bin" job submit --address "$RAY_ADDRESS" --runtime-env-json "$(runtime_env_json)" --
      "${JOB_PYTHON:-$PYTHON}" -m openrlhf_classmate.cli.train_ppo_ray "$@")
  else
    cmd=("$PYTHON" -m openrlhf_classmate.cli.train_ppo_ray "$@")
  fi
  # a local Ray cluster started by the launcher only sees the training GPUs (not the ones reserved for servers)
  if [[ -n "${TRAIN_CUDA_DEVICES:-}" && "${cmd[0]}" == "$PYTHON" ]]; then
    cmd=(env "CUDA_VISIBLE_DEVICES=$TRAIN_CUDA_DEVICES" "${cmd[@]}")
  fi
  if is_dry_run; then
    print_cmd "${cmd[@]}"
    return 0
  fi
  log "launching: $(print_cmd "${cmd[@]}")"
  local status=0
  "${cmd[@]}" || status=$?
  return "$status"
}

# preflight FLAGS...: the launcher's --check with FLAGS (before any server starts); exits on a refused run.
preflight() {
  if ! switch_on PREFLIGHT 1; then
    log "PREFLIGHT=$PREFLIGHT: skipping the launcher's --check"
    return 0
  fi
  log "preflight: $PYTHON -m openrlhf_classmate.cli.train_ppo_ray --check ..."
  # its report goes to stderr: stdout carries only the commands ("+ " lines of a dry run)
  if ! "$PYTHON" -m openrlhf_classmate.cli.train_ppo_ray --check "$@" >&2; then
    die "the launcher's preflight refused the run (the line above says why; PREFLIGHT=0 skips the check)"
  fi
}

# run_config NAME [FLAGS...]: preflight, start the queued servers, then launch with configs/NAME.yaml, the paths
# (MODEL, DATA, EVAL_DATA, OUTPUT_DIR), the config's micro-batch sizes fitted to the actor GPUs, RUN_ARGS, then
# FLAGS. EVAL_DATA="" turns evaluation off.
run_config() {
  local name=$1
  shift
  local config="$REPO_ROOT/configs/$name.yaml" out model data eval_data="" args=()
  [[ -f "$config" ]] || die "no config $config"
  out=$(abs_path "${OUTPUT_DIR:-$RUNS_DIR/${RUN_NAME:-$name}}")
  RUN_OUT_DIR=$out  # the servers started below log to its logs/ (server_log_dir)
  model=$(model_path MODEL "${MODEL:-}") || exit 1
  data=$(data_path DATA "${DATA:-}") || exit 1
  if [[ -n "${EVAL_DATA:-}" ]]; then eval_data=$(data_path EVAL_DATA "$EVAL_DATA") || exit 1; fi
  args=(--config "$config" --actor.model_name_or_path "$model" --data.prompt_dataset "$data" --eval.dataset "$eval_data")
  args+=(--ckpt.path "$out/ckpt" --ckpt.output_dir "$out/final" --logger.tensorboard_dir "$out/tensorboard")
  check_classmate_gpus "$@"
  # the configs' batch sizes are global (the algorithm's) and their micro-batch sizes per GPU: on more actor GPUs the
  # micro-batches shrink until each GPU gets a whole number of them per optimizer step (integration/launch/layout.py:
  # fit_micro_batches; a micro-batch size among FLAGS is kept); the preflight refuses what no micro-batch size fixes
  if [[ -n "${ACTOR_GPUS:-}" ]]; then
    local fitted=()
    mapfile -t fitted < <(_helper fit-micro-batches "$config" "$ACTOR_GPUS" "${RUN_ARGS[@]}" "$@")
    args+=("${fitted[@]}")
  fi
  preflight "${args[@]}" "${RUN_ARGS[@]}" "$@"
  is_dry_run || mkdir -p "$out"
  start_pending_servers
  launch "${args[@]}" "${RUN_ARGS[@]}" "$@"
}
