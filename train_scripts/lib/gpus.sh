# shellcheck shell=bash
# The GPUs of a run: detection, the split between training, classmate and servers (sourced by train_scripts/lib.sh).

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
# or a run on zero GPUs); the variable NAME is then set to it in plain decimal.
require_count() {
  local name=$1 value=$2 min=$3
  # 10#: a value like 08 is decimal here, not an invalid octal number; written back as 8, so that later arithmetic
  # (which reads 08 as octal) takes it too
  if ! [[ "$value" =~ ^[0-9]+$ ]] || ((10#$value < min)); then
    die "$name=$value: must be a whole number >= $min"
  fi
  printf -v "$name" '%d' "$((10#$value))"
}

# require_seconds NAME VALUE: VALUE must be a number of seconds > 0 (fractions allowed: sleep takes them).
require_seconds() {
  if ! [[ "$2" =~ ^([0-9]+([.][0-9]*)?|[.][0-9]+)$ ]] || ! awk -v v="$2" 'BEGIN { exit !(v > 0) }'; then
    die "$1=$2: must be a number of seconds > 0"
  fi
}

# setup_gpus: sets GPUS_PER_NODE (training), NNODES, TOTAL_GPUS, ACTOR_GPUS (TOTAL_GPUS without CLASSMATE_GPUS) and,
# with SERVER_GPUS > 0, TRAIN_CUDA_DEVICES / SERVER_CUDA_DEVICES; adds the placement flags (actor, ref, policy vLLM
# engines) to RUN_ARGS and exports OPENRLHF_CLASSMATE_GPUS.
setup_gpus() {
  local ids=() detected
  check_environment
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
