#!/usr/bin/env bash
# The README's main job: set up the environment, then a short BO demo (Branin, 25 steps, exact
# online GP, LogEI) that prints a summary table and where its records and plots went (< 1 min).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
.venv/bin/bo-online bo --problem branin --model exact --acq logei --steps 25 \
  --num-restarts 4 --raw-samples 128 --acqf-maxiter 50 --threads 1 \
  --out runs/demo --overwrite "$@"
