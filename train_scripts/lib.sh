# shellcheck shell=bash
# Shared helpers of train_scripts/*.sh. Source it (`. train_scripts/lib.sh`); it defines functions and defaults and
# runs nothing by itself.
#
# A run script sets MODEL / DATA / EVAL_DATA (and CLASSMATE_MODEL), calls setup_gpus, names the servers it needs
# (use_judge, use_tinyv, use_darling_classifiers: a server given by URL is checked at once, one to start gets its URL
# now and is started later), then run_config NAME "$@", which
#   1. runs the launcher's preflight, `python -m openrlhf_classmate.cli.train_ppo_ray --check <the flags below>`
#      (paths, datasets and labels, judge settings, tokenizers, option ranges; skip with PREFLIGHT=0),
#   2. starts the servers and waits until they answer,
#   3. launches python -m openrlhf_classmate.cli.train_ppo_ray --config configs/NAME.yaml <paths> <placement>
#      <servers> "$@"
# Later flags win, so anything passed to a run script overrides both the config and these defaults.
#
# Environment (all optional):
#   PYTHON                python with openrlhf_classmate installed (default: <repo>/.venv/bin/python, else python3)
#   RUNS_DIR              where runs write (default: <repo>/runs); OUTPUT_DIR (default: RUNS_DIR/RUN_NAME)
#   DATA_ROOT             where setup_data wrote the jsonl files (default: <repo>/data)
#   GPUS_PER_NODE         GPUs per node for training (default: detected: CUDA_VISIBLE_DEVICES, else nvidia-smi,
#                         minus SERVER_GPUS)
#   NNODES                nodes (default 1); more than one needs a Ray cluster (RAY_ADDRESS)
#                         The launcher counts the GPUs its layout asks Ray for against NNODES x GPUS_PER_NODE
#                         (exported as OPENRLHF_CLASSMATE_GPUS) and refuses in one line a layout that does not fit.
#   CLASSMATE_GPUS        GPUs of each node kept for the classmate engines (default 0). 0: the classmate engines run
#                         beside the policy engines, one per CLASSMATE_TP training GPUs (--classmate.placement auto
#                         resolves to share there, or to colocate where the engines' and servers' memory fractions
#                         do not fit one GPU); N > 0: --classmate.placement separate with N GPUs of each node for
#                         them, and the actor, reference and policy engines train on the other GPUS_PER_NODE - N
#   VLLM_TP, CLASSMATE_TP tensor-parallel size of each policy / classmate vLLM engine (default 1)
#   SERVER_GPUS           GPUs at the end of this node's list reserved for the servers the script starts (default 0:
#                         the servers share the training GPUs with a small memory fraction, exported summed as
#                         OPENRLHF_CLASSMATE_SERVER_GPU_MEMORY: placement auto counts it beside the engines)
#   SERVER_HOST           host in the server URLs (default 127.0.0.1; this node's IP when RAY_ADDRESS is set)
#   SERVER_BIND           address the servers listen on (default 127.0.0.1; 0.0.0.0 when RAY_ADDRESS is set)
#   SERVER_READY_TIMEOUT  seconds to wait for GET <url>/models (default 900: the first start downloads the model)
#   SERVER_ATTACH_TIMEOUT seconds to wait for a server given by URL (JUDGE_URL, ...; default 60)
#   SERVER_POLL_INTERVAL  seconds between readiness polls (default 5)
#   SANDBOX_URL           a running code-execution sandbox (else use_sandbox starts one on SANDBOX_PORT, default
#                         8001, with the extra service flags SANDBOX_ARGS, SANDBOX_PYTHON (default PYTHON) and
#                         SANDBOX_READY_TIMEOUT (default 120 s))
#   CODE_REWARD           code / code_stdio scores: fraction (default) or all_or_nothing
#   SERVER_LOG_DIR        server logs (default OUTPUT_DIR/logs)
#   VLLM_BIN              the vllm executable (default: vllm next to PYTHON, else vllm on PATH)
#   RAY_ADDRESS           an existing Ray cluster: the launcher is submitted with `ray job submit --address
#                         RAY_ADDRESS` (the dashboard address, e.g. http://HEAD:8265), as OpenRLHF documents
#                         Servers the script started stop when it exits: Ctrl-C on `ray job submit` only stops
#                         following the log, so stop the job itself with `ray job stop` first.
#   RAY_SUBMIT            0: run the launcher directly even with RAY_ADDRESS set (it then joins the cluster with
#                         ray.init(address=RAY_ADDRESS); use auto or HEAD:6379 for that)
#   JOB_PYTHON            python the Ray job runs (default: PYTHON; must exist on the head node)
#   RAY_JOB_ENV_VARS      names of extra environment variables to forward to the Ray job (space separated)
#   DRY_RUN               1: run the preflight, then print the server and launcher commands (lines starting with
#                         "+ ") and run nothing else
#   PREFLIGHT             0: skip the launcher's --check before the servers start (default 1)

TRAIN_SCRIPTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$TRAIN_SCRIPTS_DIR/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then PYTHON="$REPO_ROOT/.venv/bin/python"; else PYTHON="python3"; fi
fi
RUNS_DIR="${RUNS_DIR:-$REPO_ROOT/runs}"
DATA_ROOT="${DATA_ROOT:-$REPO_ROOT/data}"
WARMUP_MODEL="${WARMUP_MODEL:-$RUNS_DIR/warmup/final}"
PUBLISHED_WARMUP_MODEL="LorenaYannnnn/20260217-Qwen3-0.6B_grpo_warmup_16000_episodes_seed_42"

RUN_ARGS=()      # flags added by setup_gpus / use_* helpers, passed to the launcher before the script's arguments
SERVER_GPU_MEMORY=0  # summed --gpu-memory-utilization of the servers this script starts on the training GPUs
SERVER_PIDS=()   # process-group leaders of the servers this script started
PENDING_SERVERS=()  # shell-quoted _start_and_wait calls, run by run_config after the preflight
_TRAP_INSTALLED=0

log() { printf '[train_scripts] %s\n' "$*" >&2; }
die() {
  printf '[train_scripts] error: %s\n' "$*" >&2
  exit 1
}
is_dry_run() { [[ "${DRY_RUN:-0}" == 1 ]]; }

# Print a command as one shell-quoted line starting with "+ " (dry runs and logs).
print_cmd() {
  local out="+" arg
  for arg in "$@"; do out+=" $(printf '%q' "$arg")"; done
  printf '%s\n' "$out"
}

# ── paths ──────────────────────────────────────────────────────────────────────────────────────────────────────

# abs_path PATH: PATH made absolute (relative to the current directory); the text is kept as it is otherwise.
abs_path() {
  local p=$1
  if [[ -z "$p" || "$p" == /* ]]; then printf '%s\n' "$p"; else printf '%s\n' "$PWD/$p"; fi
}

# _looks_local PATH: absolute, ./, ../, ~, or more than one "/" (a hub id is ORG/NAME).
_looks_local() {
  local p=$1 slashes=${1//[^\/]/}
  [[ "$p" == /* || "$p" == ./* || "$p" == ../* || "$p" == "~"* || ${#slashes} -gt 1 ]]
}

# model_path WHAT PATH: a local model directory (made absolute) or a Hugging Face hub id (kept). A path that looks
# local (see _looks_local) but does not exist is an error, except in a dry run.
model_path() {
  local what=$1 p=$2
  if [[ -z "$p" ]]; then die "$what is empty"; fi
  if [[ -e "$p" ]]; then abs_path "$p"; return; fi
  if _looks_local "$p"; then
    if ! is_dry_run; then
      local hint=""
      if [[ "$p" == "$WARMUP_MODEL" ]]; then
        hint=" Run train_scripts/warmup.sh first, or set WARMUP_MODEL (for example to the published warm-up model $PUBLISHED_WARMUP_MODEL)."
      fi
      die "$what: $p does not exist.$hint"
    fi
  fi
  printf '%s\n' "$p"
}

# data_path WHAT PATH: an existing data file (made absolute) or a hub dataset id (ORG/NAME, kept); a missing local
# file is an error, except in a dry run.
data_path() {
  local what=$1 p=$2
  # missing here, shaped like ORG/NAME and not like a data file name: a hub dataset id, which the launcher downloads
  if [[ ! -e "$p" ]] && ! _looks_local "$p" && [[ "$p" != *.json* && "$p" != *.parquet ]]; then
    printf '%s\n' "$p"
    return
  fi
  if [[ ! -e "$p" ]] && ! is_dry_run; then
    die "$what: $p does not exist. Write it with the matching setup_data/*.py script (see setup_data/README.md) or set $what."
  fi
  abs_path "$p"
}

# ── GPUs ───────────────────────────────────────────────────────────────────────────────────────────────────────

# visible_gpus: this node's GPU ids, one per line (CUDA_VISIBLE_DEVICES if set, else the indices nvidia-smi lists).
visible_gpus() {
  if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
    [[ -z "$CUDA_VISIBLE_DEVICES" || "$CUDA_VISIBLE_DEVICES" == "-1" ]] && return 0
    tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | sed '/^$/d'
    return 0
  fi
  if command -v nvidia-smi >/dev/null 2>&1; then
    local n i
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
    for ((i = 0; i < ${n:-0}; i++)); do echo "$i"; done
  fi
}

# detect_gpus: how many GPUs this node shows.
detect_gpus() { visible_gpus | grep -c . || true; }

# require_count NAME VALUE MIN: VALUE must be a whole number >= MIN (a clear error instead of bash arithmetic on text,
# or a run on zero GPUs).
require_count() {
  local name=$1 value=$2 min=$3
  # 10#: a value like 08 is decimal here, not an invalid octal number
  if ! [[ "$value" =~ ^[0-9]+$ ]] || ((10#$value < min)); then
    die "$name=$value: must be a whole number >= $min"
  fi
}

# setup_gpus: sets GPUS_PER_NODE (training), NNODES, TOTAL_GPUS, ACTOR_GPUS (TOTAL_GPUS without CLASSMATE_GPUS) and,
# with SERVER_GPUS > 0, TRAIN_CUDA_DEVICES / SERVER_CUDA_DEVICES; adds the placement flags (actor, ref, policy vLLM
# engines) to RUN_ARGS and exports OPENRLHF_CLASSMATE_GPUS.
setup_gpus() {
  local ids=() detected
  mapfile -t ids < <(visible_gpus)
  detected=${#ids[@]}
  SERVER_GPUS="${SERVER_GPUS:-0}"
  CLASSMATE_GPUS="${CLASSMATE_GPUS:-0}"
  NNODES="${NNODES:-1}"
  VLLM_TP="${VLLM_TP:-1}"
  require_count SERVER_GPUS "$SERVER_GPUS" 0
  require_count CLASSMATE_GPUS "$CLASSMATE_GPUS" 0
  require_count NNODES "$NNODES" 1
  require_count VLLM_TP "$VLLM_TP" 1
  if [[ -n "${GPUS_PER_NODE:-}" ]]; then require_count GPUS_PER_NODE "$GPUS_PER_NODE" 1; fi
  if [[ -z "${GPUS_PER_NODE:-}" ]]; then
    GPUS_PER_NODE=$((detected - SERVER_GPUS))
    if ((GPUS_PER_NODE < 1)); then
      if is_dry_run; then
        # a dry run is often made on a login node without GPUs: print the commands for one GPU rather than stop
        log "dry run: no GPU detected, assuming GPUS_PER_NODE=1"
        GPUS_PER_NODE=1
      else
        die "no GPU left for training: this node shows $detected GPU(s) (CUDA_VISIBLE_DEVICES / nvidia-smi) and SERVER_GPUS=$SERVER_GPUS. Set GPUS_PER_NODE to override."
      fi
    fi
  fi
  if ((SERVER_GPUS > 0)); then
    if ((${#ids[@]} < GPUS_PER_NODE + SERVER_GPUS)); then
      if ! is_dry_run; then
        die "SERVER_GPUS=$SERVER_GPUS plus GPUS_PER_NODE=$GPUS_PER_NODE needs $((GPUS_PER_NODE + SERVER_GPUS)) GPUs; this node shows $detected"
      fi
      local i
      ids=()
      for ((i = 0; i < GPUS_PER_NODE + SERVER_GPUS; i++)); do ids+=("$i"); done
    fi
    local n=${#ids[@]}
    TRAIN_CUDA_DEVICES=$(IFS=,; echo "${ids[*]:0:GPUS_PER_NODE}")
    SERVER_CUDA_DEVICES=$(IFS=,; echo "${ids[*]:n-SERVER_GPUS:SERVER_GPUS}")
  fi
  TOTAL_GPUS=$((NNODES * GPUS_PER_NODE))
  if ((CLASSMATE_GPUS >= GPUS_PER_NODE)); then
    die "CLASSMATE_GPUS=$CLASSMATE_GPUS leaves none of the GPUS_PER_NODE=$GPUS_PER_NODE GPUs of each node to train on"
  fi
  local actor_per_node=$((GPUS_PER_NODE - CLASSMATE_GPUS))
  ACTOR_GPUS=$((NNODES * actor_per_node))
  if ((ACTOR_GPUS % VLLM_TP != 0)); then die "VLLM_TP=$VLLM_TP does not divide the $ACTOR_GPUS training GPUs"; fi
  # the launcher counts the GPUs of its layout against these (a Ray cluster would also count SERVER_GPUS as free)
  export OPENRLHF_CLASSMATE_GPUS=$TOTAL_GPUS
  RAY_JOB_ENV_VARS="${RAY_JOB_ENV_VARS:-} OPENRLHF_CLASSMATE_GPUS"
  log "training on $NNODES node(s) x $actor_per_node GPU(s)${SERVER_CUDA_DEVICES:+; servers on GPU(s) $SERVER_CUDA_DEVICES}$(
    ((CLASSMATE_GPUS)) && echo "; classmate engines on $CLASSMATE_GPUS GPU(s) of each node")"
  RUN_ARGS+=(--actor.num_nodes "$NNODES" --actor.num_gpus_per_node "$actor_per_node"
    --ref.num_nodes "$NNODES" --ref.num_gpus_per_node "$actor_per_node"
    --vllm.num_engines "$((ACTOR_GPUS / VLLM_TP))" --vllm.tensor_parallel_size "$VLLM_TP")
}

# use_classmate: adds the classmate model and its engines to RUN_ARGS, sized by where they run: with CLASSMATE_GPUS=0
# one engine per CLASSMATE_TP training GPUs, beside the policy engines (the config's placement: auto, which resolves
# to share there; colocate fits too); with CLASSMATE_GPUS=N, --classmate.placement separate and one engine per CLASSMATE_TP of the N GPUs kept
# on each node (setup_gpus gave the actor the others). Separate engines on the training GPUs would ask Ray for twice
# the node's GPUs and wait forever.
use_classmate() {
  CLASSMATE_TP="${CLASSMATE_TP:-1}"
  require_count CLASSMATE_TP "$CLASSMATE_TP" 1
  USES_CLASSMATE=1
  local gpus=$ACTOR_GPUS where=() classmate
  if ((CLASSMATE_GPUS > 0)); then
    gpus=$((NNODES * CLASSMATE_GPUS))
    where=(--classmate.placement separate)
  fi
  if ((gpus % CLASSMATE_TP != 0)); then die "CLASSMATE_TP=$CLASSMATE_TP does not divide the $gpus GPUs of the classmate engines"; fi
  classmate=$(model_path CLASSMATE_MODEL "${CLASSMATE_MODEL:-}") || exit 1
  RUN_ARGS+=(--classmate.model_name_or_path "$classmate" "${where[@]}"
    --classmate.num_engines "$((gpus / CLASSMATE_TP))" --classmate.tensor_parallel_size "$CLASSMATE_TP")
}

# flag_value FLAG ARGS...: the value of the last FLAG in ARGS (--flag VALUE or --flag=VALUE), or nothing.
flag_value() {
  local flag=$1 value="" prev="" arg
  shift
  for arg in "$@"; do
    if [[ "$prev" == "$flag" ]]; then value=$arg; fi
    if [[ "$arg" == "$flag="* ]]; then value=${arg#*=}; fi
    prev=$arg
  done
  printf '%s\n' "$value"
}

# check_classmate_gpus FLAGS...: the script's flags against CLASSMATE_GPUS (the engines were sized by it).
check_classmate_gpus() {
  local placement
  placement=$(flag_value --classmate.placement "$@")
  if [[ -z "${USES_CLASSMATE:-}" ]]; then
    ((${CLASSMATE_GPUS:-0} == 0)) || die "CLASSMATE_GPUS=$CLASSMATE_GPUS keeps GPUs for classmate engines, but this run has no classmate: unset it"
    return 0
  fi
  if [[ "$placement" == separate ]] && ((CLASSMATE_GPUS == 0)); then
    die "--classmate.placement separate gives each classmate engine a GPU of its own, but all $TOTAL_GPUS GPUs train here: set CLASSMATE_GPUS=N to keep N GPUs of each node for them (the others train), or leave the placement to auto (the classmate engines beside the policy engines)"
  fi
  if [[ "$placement" == share || "$placement" == colocate ]] && ((CLASSMATE_GPUS > 0)); then
    die "CLASSMATE_GPUS=$CLASSMATE_GPUS keeps GPUs of each node for the classmate engines (placement separate), but --classmate.placement $placement puts them on the training GPUs: drop one of the two"
  fi
}

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

# _http_ok URL: GET URL answers (status < 400) within 5 s. curl where there is one: a poll every few seconds should
# not start a Python interpreter each time.
_http_ok() {
  if command -v curl >/dev/null 2>&1; then
    curl -sf --max-time 5 -o /dev/null "$1"
  else
    _helper http-ok "$1" >/dev/null 2>&1
  fi
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

# wait_ready NAME BASE_URL TIMEOUT_S [PID] [LOG] [PATH]: poll GET BASE_URL/PATH (default /models) until it answers 200.
# Fails with a message naming the URL, the timeout and the log (its last lines) when the time runs out or the server
# process PID exits.
wait_ready() {
  local name=$1 url=${2%/} timeout=$3 pid=${4:-} logfile=${5:-} path=${6:-/models}
  local start interval=${SERVER_POLL_INTERVAL:-5} problem=""
  start=$(_now_ms)
  log "waiting for the $name server: GET $url$path (timeout ${timeout} s)"
  while :; do
    if _http_ok "$url$path"; then
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
  logdir="${SERVER_LOG_DIR:-${OUTPUT_DIR:-$RUNS_DIR/${RUN_NAME:-run}}/logs}"
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
# server there answers; otherwise queue one (started after the preflight). Sets PREFIX_URL.
use_or_start_server() {
  local prefix=$1 name=$2 port=$3 devices=$4 model=$5
  shift 5
  # the variable is read (${!var}) and set (printf -v) by name, so one helper serves JUDGE_URL, TINYV_URL, ...;
  # printf -v assigns without eval, so a URL with shell characters stays text
  local var="${prefix}_URL"
  if [[ -n "${!var:-}" ]]; then
    log "$name: using the running server $var=${!var}"
    is_dry_run || wait_ready "$name" "${!var}" "${SERVER_ATTACH_TIMEOUT:-60}" || exit 1
    return 0
  fi
  queue_server "$name" "$port" "$devices" "$model" "$@"
  printf -v "$var" '%s' "$SERVER_URL"
}

# first_model_id BASE_URL: the first model id served at BASE_URL/models (an OpenAI-compatible server).
first_model_id() { _helper first-model-id "$1"; }

# served_model WHAT BASE_URL: first_model_id, with a clear error (a placeholder in a dry run).
served_model() {
  local id
  if id=$(first_model_id "$2" 2>/dev/null); then printf '%s\n' "$id"; return 0; fi
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
  if [[ -z "${JUDGE_MODEL:-}" ]]; then JUDGE_MODEL=$(served_model JUDGE_URL "$JUDGE_URL") || exit 1; fi
  RUN_ARGS+=(--classmate.judge_base_url "$JUDGE_URL" --classmate.judge_model "$JUDGE_MODEL")
  if [[ -n "${JUDGE_API_KEY_ENV:-}" ]]; then RUN_ARGS+=(--classmate.judge_api_key_env "$JUDGE_API_KEY_ENV"); fi
}

# use_tinyv: the TinyV verifier (reward_methods.md §A.7: max-model-len 4096, memory 0.15 next to training), passed as
# --tinyv.base_url / --tinyv.model; TINYV_MODE (addon, tinyv_only, mixed) and TINYV_WEIGHT add --tinyv.mode / .weight.
use_tinyv() {
  # as in use_judge: only a server we start needs the default model name
  if [[ -z "${TINYV_URL:-}" ]]; then TINYV_MODEL="${TINYV_MODEL:-zhangchenxu/TinyV-1.5B}"; fi
  use_or_start_server TINYV tinyv "${TINYV_PORT:-8001}" "${TINYV_DEVICES-${SERVER_CUDA_DEVICES:-}}" "${TINYV_MODEL:-}" \
    --served-model-name "${TINYV_MODEL:-}" --tensor-parallel-size "${TINYV_TP:-1}" \
    --gpu-memory-utilization "${TINYV_GPU_MEM:-$(default_server_mem 0.15)}" --max-model-len "${TINYV_MAX_MODEL_LEN:-4096}" \
    ${TINYV_EXTRA_ARGS:-}
  if [[ -z "${TINYV_MODEL:-}" ]]; then TINYV_MODEL=$(served_model TINYV_URL "$TINYV_URL") || exit 1; fi
  RUN_ARGS+=(--tinyv.base_url "$TINYV_URL" --tinyv.model "$TINYV_MODEL")
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
    [[ -n "${DARLING_CLASSIFIER_MODEL:-}" ]] || die "DARLING needs its pair classifier: set DARLING_CLASSIFIER_MODEL (a fine-tuned 2-class sequence classifier, reward_methods.md §B.1) or DARLING_CLASSIFIER_URLS"
    n="${DARLING_NUM_SERVERS:-1}"
    if [[ -n "${SERVER_CUDA_DEVICES:-}" ]]; then IFS=',' read -r -a devices <<<"$SERVER_CUDA_DEVICES"
    else mapfile -t devices < <(visible_gpus); fi
    ((${#devices[@]})) || devices=(0)
    for ((i = 0; i < n; i++)); do
      dev="${devices[$((i % ${#devices[@]}))]}"
      port=$((${DARLING_PORT:-8010} + i))
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
      logdir="${SERVER_LOG_DIR:-${OUTPUT_DIR:-$RUNS_DIR/${RUN_NAME:-run}}/logs}"
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
  if [[ -n "${RAY_ADDRESS:-}" && "${RAY_SUBMIT:-1}" != 0 ]]; then
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
  if [[ "${PREFLIGHT:-1}" == 0 ]]; then
    log "PREFLIGHT=0: skipping the launcher's --check"
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
