#!/usr/bin/env bash
# Set up the environment, then run the test suite (fast, float64, CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
# Lint and format check first (configured in pyproject.toml): a finding fails the run.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m pytest "$@"
