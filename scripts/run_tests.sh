#!/usr/bin/env bash
# Sets everything up, then runs ruff and the tests.
#   bash scripts/run_tests.sh          the whole suite (CI): the unit and integration tests on three pytest-xdist
#                                      workers, then the slow end-to-end runs (Ray, DeepSpeed, the launcher, the demo;
#                                      `pytest -m slow`) one at a time: each of them already uses the machine's cores
#   bash scripts/run_tests.sh --fast   the unit and integration tests only (`pytest -m "not slow"`, three workers)
# Three workers on two cores: about half of the unit and integration tests' time is waiting (a sandbox's time limits,
# HTTP servers' timeouts, a watchdog's quiet limit, a subprocess starting), which a third worker fills.
# Further arguments go to pytest (then one pytest run, in one process, of what they select, plus --fast's filter).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
fast=0
if [ "${1:-}" = "--fast" ]; then fast=1; shift; fi
bash scripts/setup.sh
.venv/bin/python -m ruff check .
pytest=(.venv/bin/python -m pytest)
if [ $# -gt 0 ]; then
  if [ $fast = 1 ]; then exec "${pytest[@]}" -m "not slow" "$@"; fi
  exec "${pytest[@]}" "$@"
fi
if [ $fast = 1 ]; then exec "${pytest[@]}" -m "not slow" -n 3 --dist loadfile; fi
status=0
"${pytest[@]}" -m "not slow" -n 3 --dist loadfile || status=$?
"${pytest[@]}" -m slow || { s=$?; [ $status -ne 0 ] || status=$s; }
exit $status
