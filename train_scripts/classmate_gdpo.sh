#!/usr/bin/env bash
# Classmate-CoT with GDPO, the main method (configs/classmate_gdpo.yaml): classmate_helpful.sh classmate_gdpo.
#
#   train_scripts/classmate_gdpo.sh [launcher flags...]
#
# Environment: classmate_helpful.sh.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/classmate_helpful.sh" classmate_gdpo "$@"
