#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite (slow end-to-end tests included) and ruff.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
.venv/bin/python -m ruff check .
exec .venv/bin/python -m pytest "$@"
