#!/usr/bin/env bash
# Sets everything up, then runs the embedded CPU demo, or with --gpu the GPU demo (python -m openrlhf_classmate.demo
# --help for options; docs/demo.md).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
exec .venv/bin/python -m openrlhf_classmate.demo "$@"
