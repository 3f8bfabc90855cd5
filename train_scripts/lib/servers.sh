# shellcheck shell=bash
# Model servers a run script starts or attaches to: URLs, start, readiness, stop (sourced by train_scripts/lib.sh).

# ── servers ────────────────────────────────────────────────────────────────────────────────────────────────────

_server_host() {
  if [[ -n "${SERVER_HOST:-}" ]]; then echo "$SERVER_HOST"; return; fi
  if [[ -n "${RAY_ADDRESS:-}" ]]; then
    local ip
    ip=$(hostname -I 2>/dev/null | awk '{print $1}')
    echo "${ip:-$(hostname)}"
  else
    echo 127.0.0.1
  fi
}

# _server_url PORT: the OpenAI-style root of a server this script starts on PORT.
_server_url() { echo "http://$(_server_host):$1/v1"; }

_server_bind() {
  if [[ -n "${SERVER_BIND:-}" ]]; then echo "$SERVER_BIND"
  elif [[ -n "${RAY_ADDRESS:-}" ]]; then echo 0.0.0.0
  else echo 127.0.0.1; fi
}

# default_server_mem: GPU memory fraction of a server: small when it shares the training GPUs.
default_server_mem() { if ((${SERVER_GPUS:-0} > 0)); then echo 0.85; else echo "${1:-0.15}"; fi; }

_vllm_bin() {
  if [[ -n "${VLLM_BIN:-}" ]]; then echo "$VLLM_BIN"
  elif [[ "$PYTHON" == */* && -x "$(dirname "$PYTHON")/vllm" ]]; then echo "$(dirname "$PYTHON")/vllm"
  else echo vllm; fi
}

# _helper COMMAND ARGS...: python -m openrlhf_classmate.script_helpers (HTTP and JSON, which bash does badly), from
# this repository's copy of the package even when PYTHON has another one installed.
_helper() { PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m openrlhf_classmate.script_helpers "$@"; }

# _http_ok URL [KEY_ENV]: GET URL answers (status < 400) within 5 s, sent with the API key in the environment variable
# KEY_ENV where it is set. curl where there is one: a poll every few seconds should not start a Python interpreter
# each time.
_http_ok() {
  local key=""
  if [[ -n "${2:-}" ]]; then key="${!2:-}"; fi
  if command -v curl >/dev/null 2>&1; then
    if [[ -n "$key" ]]; then
      # the header in a curl config read from stdin (-K -, which old curl has too): a key in curl's arguments would
      # be on every process listing; \ and " escaped as the config's quoted strings want
      key=${key//\\/\\\\}
      key=${key//\"/\\\"}
      printf 'header = "Authorization: Bearer %s"\n' "$key" | curl -K - -sf --max-time 5 -o /dev/null "$1"
    else
      curl -sf --max-time 5 -o /dev/null "$1"
    fi
  else
    _helper http-ok "$1" ${2:+"$2"} >/dev/null 2>&1
  fi
}

# server_log_dir: where the servers this script starts write their logs: SERVER_LOG_DIR, else the run's logs/ folder
# (run_config's output folder; before run_config, OUTPUT_DIR or RUNS_DIR/RUN_NAME). Absolute: the sandbox starts
# from the repository root.
server_log_dir() {
  if [[ -n "${SERVER_LOG_DIR:-}" ]]; then abs_path "$SERVER_LOG_DIR"; return; fi
  abs_path "${RUN_OUT_DIR:-${OUTPUT_DIR:-$RUNS_DIR/${RUN_NAME:-run}}}/logs"
}

_on_exit() {
  local status=$?
  stop_servers
  exit "$status"
}

_install_trap() {
  if ((_TRAP_INSTALLED)); then return; fi
  trap _on_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  _TRAP_INSTALLED=1
}

# stop_servers: terminate every server this script started (their whole process groups), then wait for them.
stop_servers() {
  local pid waited=0
  ((${#SERVER_PIDS[@]})) || return 0
  for pid in "${SERVER_PIDS[@]}"; do
    # the negative pid signals the whole process group: vllm serve has worker processes that hold GPU memory;
    # the plain pid is the fallback where setsid was missing and the server shares our group
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${SERVER_PIDS[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((waited < 300)); do
      sleep 0.1
      waited=$((waited + 1))
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
  log "stopped ${#SERVER_PIDS[@]} server(s)"
  SERVER_PIDS=()
}

# _now_ms: wall-clock milliseconds (bash 5's EPOCHREALTIME; whole seconds on older bash).
_now_ms() {
  local t=${EPOCHREALTIME:-}
  if [[ -n "$t" ]]; then
    t=${t/[.,]/}
    echo $((10#$t / 1000))
  else
    echo $((SECONDS * 1000))
  fi
}

# wait_ready NAME BASE_URL TIMEOUT_S [PID] [LOG] [PATH] [KEY_ENV]: poll GET BASE_URL/PATH (default /models) until it
# answers 200 (with the API key in KEY_ENV, where set). Fails with a message naming the URL, the timeout and the log
# (its last lines) when the time runs out or the server process PID exits.
wait_ready() {
  local name=$1 url=${2%/} timeout=$3 pid=${4:-} logfile=${5:-} path=${6:-/models} key_env=${7:-}
  local start interval=${SERVER_POLL_INTERVAL:-5} problem=""
  # a timeout bash cannot compare (2.5, 1e3) would never fire
  [[ "$timeout" =~ ^[0-9]+$ ]] || die "the $name server's timeout '$timeout' is no whole number of seconds"
  timeout=$((10#$timeout))
  require_seconds SERVER_POLL_INTERVAL "$interval"
  start=$(_now_ms)
  log "waiting for the $name server: GET $url$path (timeout ${timeout} s)"
  while :; do
    if _http_ok "$url$path" "$key_env"; then
      log "$name server ready at $url ($((($(_now_ms) - start) / 1000)) s)"
      return 0
    fi
    if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
      problem="its process (pid $pid) exited before answering"
      break
    fi
    if (($(_now_ms) - start >= timeout * 1000)); then
      problem="not ready after ${timeout} s (GET $url$path never answered 200)"
      break
    fi
    sleep "$interval"
  done
  printf '[train_scripts] error: %s server at %s: %s.\n' "$name" "$url" "$problem" >&2
  if [[ -n "$logfile" && -f "$logfile" ]]; then
    printf '[train_scripts] server log %s (last 20 lines):\n' "$logfile" >&2
    tail -n 20 "$logfile" | sed 's/^/    /' >&2
  elif [[ -z "$pid" ]]; then
    printf '[train_scripts] this URL was given, not started here: check that the server runs, or unset the *_URL variable to let the script start one.\n' >&2
  fi
  return 1
}

# start_vllm_server NAME PORT DEVICES MODEL [vllm serve flags...]: `vllm serve MODEL` in the background, in its own
# process group (stopped on exit), logging to SERVER_LOG_DIR/NAME.log. DEVICES ("" = inherit) becomes its
# CUDA_VISIBLE_DEVICES. Sets SERVER_URL (http://HOST:PORT/v1) and SERVER_PID.
start_vllm_server() {
  local name=$1 port=$2 devices=$3 model=$4
  shift 4
  local bin logdir logfile cmd=()
  bin=$(_vllm_bin)
  logdir=$(server_log_dir)
  logfile="$logdir/$name.log"
  SERVER_URL=$(_server_url "$port")
  read -r -a cmd <<<"$bin"
  cmd+=(serve "$model" --host "$(_server_bind)" --port "$port" "$@")
  if is_dry_run; then
    if [[ -n "$devices" ]]; then print_cmd env "CUDA_VISIBLE_DEVICES=$devices" "${cmd[@]}"; else print_cmd "${cmd[@]}"; fi
    SERVER_PID=""
    return 0
  fi
  mkdir -p "$logdir"
  _install_trap
  log "starting the $name server: $(print_cmd "${cmd[@]}") (log: $logfile)"
  # setsid: the server gets its own process group, so stop_servers can end it with all its worker processes
  local setsid_bin=()
  if command -v setsid >/dev/null 2>&1; then setsid_bin=(setsid); fi
  if [[ -n "$devices" ]]; then
    CUDA_VISIBLE_DEVICES="$devices" "${setsid_bin[@]}" "${cmd[@]}" >"$logfile" 2>&1 </dev/null &
  else
    "${setsid_bin[@]}" "${cmd[@]}" >"$logfile" 2>&1 </dev/null &
  fi
  SERVER_PID=$!
  SERVER_PIDS+=("$SERVER_PID")
  SERVER_LOG="$logfile"
}

# queue_server NAME PORT DEVICES MODEL [vllm serve flags...]: start_vllm_server + wait_ready, deferred until
# run_config has run the preflight (no server starts for a run that would be refused). Sets SERVER_URL now.
queue_server() {
  local call
  # stored shell-quoted (%q) so that start_pending_servers can eval it later with every argument intact
  printf -v call '%q ' _start_and_wait "$@"
  PENDING_SERVERS+=("$call")
  SERVER_URL=$(_server_url "$2")
  if ((${SERVER_GPUS:-0} == 0)); then
    # on the training GPUs the server holds its fraction beside the engines all run long: the launcher's placement
    # auto counts it (a classmate engine awake beside the policy engines would otherwise not fit); summed, an upper
    # bound where the servers are spread over several GPUs
    local memory
    memory=$(flag_value --gpu-memory-utilization "$@")
    SERVER_GPU_MEMORY=$(awk -v a="$SERVER_GPU_MEMORY" -v b="${memory:-0}" 'BEGIN { print a + b }')
    export OPENRLHF_CLASSMATE_SERVER_GPU_MEMORY=$SERVER_GPU_MEMORY
    RAY_JOB_ENV_VARS="${RAY_JOB_ENV_VARS:-} OPENRLHF_CLASSMATE_SERVER_GPU_MEMORY"
  fi
}

_start_and_wait() {
  local name=$1
  start_vllm_server "$@"
  is_dry_run || wait_ready "$name" "$SERVER_URL" "${SERVER_READY_TIMEOUT:-900}" "$SERVER_PID" "$SERVER_LOG" || exit 1
}

# start_pending_servers: start every queued server (in a dry run: print its command) and wait for each.
start_pending_servers() {
  local call
  for call in "${PENDING_SERVERS[@]}"; do eval "$call"; done
  PENDING_SERVERS=()
}

# use_or_start_server PREFIX NAME PORT DEVICES MODEL [vllm serve flags...]: when PREFIX_URL is set, check that the
# server there answers (with the API key named by server_key_env PREFIX); otherwise queue one (started after the
# preflight). Sets PREFIX_URL.
use_or_start_server() {
  local prefix=$1 name=$2 port=$3 devices=$4 model=$5
  shift 5
  # the variable is read (${!var}) and set (printf -v) by name, so one helper serves JUDGE_URL, TINYV_URL, ...;
  # printf -v assigns without eval, so a URL with shell characters stays text
  local var="${prefix}_URL"
  if [[ -n "${!var:-}" ]]; then
    log "$name: using the running server $var=${!var}"
    is_dry_run || wait_ready "$name" "${!var}" "${SERVER_ATTACH_TIMEOUT:-60}" "" "" /models "$(server_key_env "$prefix")" \
      || exit 1
    return 0
  fi
  queue_server "$name" "$port" "$devices" "$model" "$@"
  printf -v "$var" '%s' "$SERVER_URL"
}
