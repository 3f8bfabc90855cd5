# shellcheck shell=bash
# Shared helpers of train_scripts/*.sh. Source it (`. train_scripts/lib.sh`; it sources train_scripts/lib/*.sh); it
# defines functions and defaults and runs nothing by itself.
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
#   SERVER_READY_TIMEOUT  whole seconds to wait for GET <url>/models (default 900: the first start downloads the model)
#   SERVER_ATTACH_TIMEOUT whole seconds to wait for a server given by URL (JUDGE_URL, ...; default 60)
#   SERVER_POLL_INTERVAL  seconds between readiness polls (default 5; fractions allowed)
#   SANDBOX_URL           a running code-execution sandbox (else use_sandbox starts one on SANDBOX_PORT, default
#                         8001, with the extra service flags SANDBOX_ARGS, SANDBOX_PYTHON (default PYTHON) and
#                         SANDBOX_READY_TIMEOUT (default 120 s))
#   CODE_REWARD           code / code_stdio scores: fraction (default) or all_or_nothing
#   SERVER_LOG_DIR        server logs (default OUTPUT_DIR/logs, made absolute)
#   JUDGE_API_KEY_ENV,    environment variable holding the judge's / TinyV verifier's API key (judge default
#   TINYV_API_KEY_ENV     OPENAI_API_KEY, the launcher's; TinyV: none): passed to the launcher, and sent by the
#                         script's own readiness poll and model-name lookup of a server given by URL
#   VLLM_BIN              the vllm executable (default: vllm next to PYTHON, else vllm on PATH)
#   RAY_ADDRESS           an existing Ray cluster: the launcher is submitted with `ray job submit --address
#                         RAY_ADDRESS` (the dashboard address, e.g. http://HEAD:8265), as OpenRLHF documents
#                         Servers the script started stop when it exits: Ctrl-C on `ray job submit` only stops
#                         following the log, so stop the job itself with `ray job stop` first.
#   RAY_SUBMIT            0 (or false, no, off): run the launcher directly even with RAY_ADDRESS set (it then joins the cluster with
#                         ray.init(address=RAY_ADDRESS); use auto or HEAD:6379 for that)
#   JOB_PYTHON            python the Ray job runs (default: PYTHON; must exist on the head node)
#   RAY_JOB_ENV_VARS      names of extra environment variables to forward to the Ray job (space separated)
#   DRY_RUN               1 (or true, yes, on): run the preflight, then print the server and launcher commands (lines starting with
#                         "+ ") and run nothing else
#   PREFLIGHT             0 (or false, no, off): skip the launcher's --check before the servers start (default 1)
#   A switch (DRY_RUN, PREFLIGHT, RAY_SUBMIT) with another value ends the script with one line naming it.

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
RUN_OUT_DIR=""   # run_config's output folder, once it is known (server_log_dir); never taken from the environment
_TRAP_INSTALLED=0

log() { printf '[train_scripts] %s\n' "$*" >&2; }
die() {
  printf '[train_scripts] error: %s\n' "$*" >&2
  exit 1
}

# switch_on NAME DEFAULT: the switch variable NAME is on (1, true, yes, on; any case) or off (0, false, no, off);
# unset or empty: DEFAULT. Anything else ends the script with one line (DRY_RUN=true must not start a real run).
switch_on() {
  local name=$1 value="${!1:-$2}"
  case "${value,,}" in
    1 | true | yes | on) return 0 ;;
    0 | false | no | off) return 1 ;;
    *) die "$name=$value: use 1 (or true, yes, on) or 0 (or false, no, off)" ;;
  esac
}
is_dry_run() { switch_on DRY_RUN 0; }

# check_environment: the switches, the servers' wait settings and API-key variable names, checked before any work
# (one line each), not where a server has already started. setup_gpus, every run script's first step, calls it.
check_environment() {
  local name
  switch_on DRY_RUN 0 || true
  switch_on PREFLIGHT 1 || true
  switch_on RAY_SUBMIT 1 || true
  for name in SERVER_READY_TIMEOUT SERVER_ATTACH_TIMEOUT SANDBOX_READY_TIMEOUT; do
    if [[ -n "${!name:-}" ]]; then require_count "$name" "${!name}" 1; fi
  done
  if [[ -n "${SERVER_POLL_INTERVAL:-}" ]]; then require_seconds SERVER_POLL_INTERVAL "$SERVER_POLL_INTERVAL"; fi
  for name in JUDGE_API_KEY_ENV TINYV_API_KEY_ENV; do
    if [[ -n "${!name:-}" && ! "${!name}" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
      # the value is not echoed: a key put here by mistake would land in the terminal and the logs
      die "$name is not the name of an environment variable (letters, digits, _): put the key in a variable and name that variable here"
    fi
  done
}

# Print a command as one shell-quoted line starting with "+ " (dry runs and logs).
print_cmd() {
  local out="+" arg
  for arg in "$@"; do out+=" $(printf '%q' "$arg")"; done
  printf '%s\n' "$out"
}

# the functions, one file per section: paths, GPUs, servers (starting, readiness, stop), the servers by role, launch
for _lib_part in paths gpus servers server_roles launch; do
  # shellcheck source=/dev/null
  . "$TRAIN_SCRIPTS_DIR/lib/$_lib_part.sh"
done
unset _lib_part
