#!/usr/bin/env bash
# Set up the environment, then run the main job: a short Bayesian-optimisation demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
.venv/bin/python -m bo_online.demo "$@"
