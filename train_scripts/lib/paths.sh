# shellcheck shell=bash
# Model and data paths of a run script (sourced by train_scripts/lib.sh).

# ── paths ──────────────────────────────────────────────────────────────────────────────────────────────────────

# abs_path PATH: PATH made absolute (relative to the current directory); the text is kept as it is otherwise.
abs_path() {
  local p=$1
  if [[ -z "$p" || "$p" == /* ]]; then printf '%s\n' "$p"; else printf '%s\n' "$PWD/$p"; fi
}

# _looks_local PATH: a local path rather than a hub id (NAME or ORG/NAME). The preflight's rule (looks_local in
# openrlhf_classmate/integration/launch/preflight_types.py), written again in bash because PYTHON may be a stand-in
# launcher here; tests/test_train_scripts.py runs both on the same paths. One difference is left: Python's \w also
# takes non-ASCII letters, so a missing "modèle" is a hub id there and a local path (an error) here.
_looks_local() {
  local p=$1 slashes=${1//[^\/]/}
  [[ "$p" == /* || "$p" == ./* || "$p" == ../* || "$p" == "~"* || ${#slashes} -gt 1 ]] && return 0
  ! [[ "$p" =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9_.-]+)?$ ]]
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
