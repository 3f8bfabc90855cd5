# shellcheck shell=bash
# The servers by role: judge, TinyV verifier, DARLING classifiers, code sandbox (sourced by train_scripts/lib.sh;
# they start through lib/servers.sh).

# first_model_id BASE_URL [KEY_ENV]: the first model id served at BASE_URL/models (an OpenAI-compatible server), asked
# with the API key in the environment variable KEY_ENV where it is set.
first_model_id() { _helper first-model-id "$1" ${2:+"$2"}; }

# server_key_env PREFIX: the environment variable holding the API key of the PREFIX server (JUDGE, TINYV): the one the
# launcher will read, PREFIX_API_KEY_ENV, by default OPENAI_API_KEY for the judge (the launcher's) and none for TinyV.
server_key_env() {
  local var="$1_API_KEY_ENV"
  if [[ -n "${!var:-}" ]]; then echo "${!var}"; elif [[ "$1" == JUDGE ]]; then echo OPENAI_API_KEY; fi
}

# served_model WHAT BASE_URL [KEY_ENV]: first_model_id, with a clear error (a placeholder in a dry run).
served_model() {
  local id
  if id=$(first_model_id "$2" "${3:-}" 2>/dev/null); then printf '%s\n' "$id"; return 0; fi
  if is_dry_run; then printf '%s\n' "MODEL-SERVED-AT-$1"; return 0; fi
  die "cannot read the served model name from $2/models ($1); set the matching *_MODEL variable"
}

# use_judge: the LLM judge (sycophancy rating) for the scorer registry. JUDGE_URL: use a running OpenAI-compatible
# server (JUDGE_MODEL defaults to the first model it serves); otherwise start `vllm serve JUDGE_MODEL`.
use_judge() {
  # a server we start needs a model name; a running one (JUDGE_URL) can tell us its own, so no default is forced on it
  if [[ -z "${JUDGE_URL:-}" ]]; then JUDGE_MODEL="${JUDGE_MODEL:-Qwen/Qwen3-4B-Instruct-2507}"; fi
  use_or_start_server JUDGE judge "${JUDGE_PORT:-8000}" "${JUDGE_DEVICES-${SERVER_CUDA_DEVICES:-}}" "${JUDGE_MODEL:-}" \
    --served-model-name "${JUDGE_MODEL:-}" --tensor-parallel-size "${JUDGE_TP:-1}" \
    --gpu-memory-utilization "${JUDGE_GPU_MEM:-$(default_server_mem 0.2)}" --max-model-len "${JUDGE_MAX_MODEL_LEN:-16384}" \
    ${JUDGE_EXTRA_ARGS:-}
  if [[ -z "${JUDGE_MODEL:-}" ]]; then JUDGE_MODEL=$(served_model JUDGE_URL "$JUDGE_URL" "$(server_key_env JUDGE)") || exit 1; fi
  RUN_ARGS+=(--classmate.judge_base_url "$JUDGE_URL" --classmate.judge_model "$JUDGE_MODEL")
  if [[ -n "${JUDGE_API_KEY_ENV:-}" ]]; then RUN_ARGS+=(--classmate.judge_api_key_env "$JUDGE_API_KEY_ENV"); fi
}

# use_tinyv: the TinyV verifier (served as TinyV's run_grpo_tinyv.sh does: max-model-len 4096, memory 0.15 next to training), passed as
# --tinyv.base_url / --tinyv.model; TINYV_MODE (addon, tinyv_only, mixed) and TINYV_WEIGHT add --tinyv.mode / .weight.
use_tinyv() {
  # as in use_judge: only a server we start needs the default model name
  if [[ -z "${TINYV_URL:-}" ]]; then TINYV_MODEL="${TINYV_MODEL:-zhangchenxu/TinyV-1.5B}"; fi
  use_or_start_server TINYV tinyv "${TINYV_PORT:-8001}" "${TINYV_DEVICES-${SERVER_CUDA_DEVICES:-}}" "${TINYV_MODEL:-}" \
    --served-model-name "${TINYV_MODEL:-}" --tensor-parallel-size "${TINYV_TP:-1}" \
    --gpu-memory-utilization "${TINYV_GPU_MEM:-$(default_server_mem 0.15)}" --max-model-len "${TINYV_MAX_MODEL_LEN:-4096}" \
    ${TINYV_EXTRA_ARGS:-}
  if [[ -z "${TINYV_MODEL:-}" ]]; then TINYV_MODEL=$(served_model TINYV_URL "$TINYV_URL" "$(server_key_env TINYV)") || exit 1; fi
  RUN_ARGS+=(--tinyv.base_url "$TINYV_URL" --tinyv.model "$TINYV_MODEL")
  if [[ -n "${TINYV_API_KEY_ENV:-}" ]]; then RUN_ARGS+=(--tinyv.api_key_env "$TINYV_API_KEY_ENV"); fi
  # TinyV's VERIFIER_SETUP / VERIFIER_WEIGHT script arguments
  if [[ -n "${TINYV_MODE:-}" ]]; then RUN_ARGS+=(--tinyv.mode "$TINYV_MODE"); fi
  if [[ -n "${TINYV_WEIGHT:-}" ]]; then RUN_ARGS+=(--tinyv.weight "$TINYV_WEIGHT"); fi
}

# use_darling_classifiers: DARLING's pair classifier, DARLING_NUM_SERVERS single-GPU `vllm serve --runner pooling`
# servers on ports DARLING_PORT, DARLING_PORT+1, ... (served as similarity_gpu_<i>); or DARLING_CLASSIFIER_URLS
# (comma-separated, running servers). Passes them as --darling.classifier_urls and exports DARLING_CLASSIFIER_URLS
# (OpenAI-style roots, http://HOST:PORT/v1).
use_darling_classifiers() {
  local urls=() i n devices=() dev port
  if [[ -n "${DARLING_CLASSIFIER_URLS:-}" ]]; then
    IFS=',' read -r -a urls <<<"$DARLING_CLASSIFIER_URLS"
    for i in "${!urls[@]}"; do
      is_dry_run || wait_ready "darling classifier $i" "${urls[$i]}" "${SERVER_ATTACH_TIMEOUT:-60}" || exit 1
    done
  else
    [[ -n "${DARLING_CLASSIFIER_MODEL:-}" ]] || die "DARLING needs its pair classifier: set DARLING_CLASSIFIER_MODEL (a fine-tuned 2-class sequence classifier: same meaning or not) or DARLING_CLASSIFIER_URLS"
    require_count DARLING_NUM_SERVERS "${DARLING_NUM_SERVERS:-1}" 1
    require_count DARLING_PORT "${DARLING_PORT:-8010}" 1
    n=$DARLING_NUM_SERVERS
    if [[ -n "${SERVER_CUDA_DEVICES:-}" ]]; then IFS=',' read -r -a devices <<<"$SERVER_CUDA_DEVICES"
    else mapfile -t devices < <(visible_gpus); fi
    ((${#devices[@]})) || devices=(0)
    for ((i = 0; i < n; i++)); do
      dev="${devices[$((i % ${#devices[@]}))]}"
      port=$((DARLING_PORT + i))
      queue_server "darling_classifier_$i" "$port" "$dev" "$DARLING_CLASSIFIER_MODEL" \
        --runner pooling --served-model-name "similarity_gpu_$i" \
        --gpu-memory-utilization "${DARLING_GPU_MEM:-$(default_server_mem 0.15)}" \
        --max-model-len "${DARLING_MAX_MODEL_LEN:-4096}" ${DARLING_EXTRA_ARGS:-}
      urls+=("$SERVER_URL")
    done
  fi
  DARLING_CLASSIFIER_URLS=$(IFS=,; echo "${urls[*]}")
  export DARLING_CLASSIFIER_URLS
  RUN_ARGS+=(--darling.classifier_urls "${urls[@]}")
  RAY_JOB_ENV_VARS="${RAY_JOB_ENV_VARS:-} DARLING_CLASSIFIER_URLS"
  log "DARLING_CLASSIFIER_URLS=$DARLING_CLASSIFIER_URLS"
}

# use_sandbox: the code-execution sandbox service for the code / code_stdio scorers. SANDBOX_URL: use a running one
# (GET SANDBOX_URL/health must answer); otherwise start `PYTHON -m openrlhf_classmate.sandbox` in the background (own
# process group, log SERVER_LOG_DIR/sandbox.log, stopped on exit) on SANDBOX_PORT and wait for its /health. Exports
# OPENRLHF_CLASSMATE_SANDBOX_URL (the launcher forwards OPENRLHF_CLASSMATE_* to the reward processes) and, when
# CODE_REWARD is set, OPENRLHF_CLASSMATE_CODE_REWARD (fraction | all_or_nothing).
use_sandbox() {
  local timeout="${SANDBOX_READY_TIMEOUT:-120}" cmd=() bind logdir logfile
  if [[ -n "${CODE_REWARD:-}" ]]; then
    [[ "$CODE_REWARD" == fraction || "$CODE_REWARD" == all_or_nothing ]] || \
      die "CODE_REWARD must be fraction or all_or_nothing, got '$CODE_REWARD'"
    export OPENRLHF_CLASSMATE_CODE_REWARD="$CODE_REWARD"
    RAY_JOB_ENV_VARS="${RAY_JOB_ENV_VARS:-} OPENRLHF_CLASSMATE_CODE_REWARD"
  fi
  if [[ -n "${SANDBOX_URL:-}" ]]; then
    log "sandbox: using the running service SANDBOX_URL=$SANDBOX_URL"
    is_dry_run || wait_ready sandbox "$SANDBOX_URL" "${SERVER_ATTACH_TIMEOUT:-60}" "" "" /health || exit 1
  else
    bind=$(_server_bind)
    SANDBOX_URL="http://$(_server_host):${SANDBOX_PORT:-8001}"
    # shellcheck disable=SC2206
    cmd=("${SANDBOX_PYTHON:-$PYTHON}" -m openrlhf_classmate.sandbox --host "$bind" --port "${SANDBOX_PORT:-8001}"
      ${SANDBOX_ARGS:-})
    if is_dry_run; then
      print_cmd "${cmd[@]}"
    else
      if [[ "$bind" != 127.0.0.1 && "$bind" != localhost ]]; then
        log "warning: the sandbox listens on $bind: anyone who reaches port ${SANDBOX_PORT:-8001} can run programs there"
      fi
      logdir=$(server_log_dir)
      logfile="$logdir/sandbox.log"
      mkdir -p "$logdir"
      _install_trap
      log "starting the sandbox: $(print_cmd "${cmd[@]}") (log: $logfile)"
      local setsid_bin=()
      if command -v setsid >/dev/null 2>&1; then setsid_bin=(setsid); fi
      # from the repository root: the service hides its working directory (data, runs) from the programs
      (cd "$REPO_ROOT" && exec "${setsid_bin[@]}" "${cmd[@]}" >"$logfile" 2>&1 </dev/null) &
      SERVER_PID=$!
      SERVER_PIDS+=("$SERVER_PID")
      wait_ready sandbox "$SANDBOX_URL" "$timeout" "$SERVER_PID" "$logfile" /health || exit 1
      grep -h '^\[sandbox\]' "$logfile" | sed 's/^/[train_scripts] /' >&2 || true
    fi
  fi
  export OPENRLHF_CLASSMATE_SANDBOX_URL="$SANDBOX_URL"
  RAY_JOB_ENV_VARS="${RAY_JOB_ENV_VARS:-} OPENRLHF_CLASSMATE_SANDBOX_URL"
  log "OPENRLHF_CLASSMATE_SANDBOX_URL=$SANDBOX_URL"
}
