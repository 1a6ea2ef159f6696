#!/usr/bin/env bash
# The main job on the built-in demo data: sets everything up, then runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/tpu-pipeline demo "$@"
