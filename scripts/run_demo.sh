#!/usr/bin/env bash
# The main job on the built-in demo data: sets everything up, then trains and evaluates
# a small CNN on it (tpu-pipeline train with no --config). Extra arguments pass through.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/tpu-pipeline train "$@"
