#!/usr/bin/env bash
# Sets everything up, then runs ruff and the tests.
#   bash scripts/run_tests.sh [ARGS]          the whole suite (CI): the unit and integration tests on three
#                                             pytest-xdist workers, then the slow end-to-end runs (Ray, DeepSpeed, the
#                                             launcher, the demo; `pytest -m slow`) on two workers, one test file each
#   bash scripts/run_tests.sh --fast [ARGS]   the unit and integration tests only (`pytest -m "not slow"`, three
#                                             workers)
# ARGS (pytest options, test paths) go to each pytest run: `--durations=40`, `tests/test_x.py`, `-k name`, `-x`;
# `-n 0` runs each part in one process (a debugger, `-s`). A part that ARGS leave empty is
# skipped. Three workers on two cores: about half of the unit and integration tests' time is waiting (a sandbox's
# time limits, HTTP servers' timeouts, a watchdog's quiet limit, a subprocess starting), which a third worker fills.
# Two workers for the slow tests: a launcher run leaves a core idle for much of its time (its own imports, Ray's
# start, the one-process steps, the test's checks), which the other file's run fills; per file (--dist loadfile), so
# that a module's shared run (a module-scoped fixture: the quick demo, the plain-GRPO run) is launched once.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
fast=0
if [ "${1:-}" = "--fast" ]; then fast=1; shift; fi
bash scripts/setup.sh
.venv/bin/python -m ruff check .
pytest=(.venv/bin/python -m pytest)
if [ $fast = 1 ]; then exec "${pytest[@]}" -m "not slow" -n 3 --dist loadfile "$@"; fi
NO_TESTS=5  # pytest's exit status when the selection is empty
unit=0 slow=0
"${pytest[@]}" -m "not slow" -n 3 --dist loadfile "$@" || unit=$?
"${pytest[@]}" -m slow -n 2 --dist loadfile "$@" || slow=$?
if [ $unit = $NO_TESTS ] && [ $slow != $NO_TESTS ]; then unit=0; fi
if [ $slow = $NO_TESTS ] && [ $unit = 0 ]; then slow=0; fi
if [ $unit != 0 ]; then exit $unit; fi
exit $slow
