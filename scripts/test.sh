#!/usr/bin/env bash
# Set up the environment, then run the test suite (fast, float64, CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
.venv/bin/python -m pytest "$@"
