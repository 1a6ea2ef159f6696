#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite (CPU only; 8 logical CPU replicas).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m pytest -q "$@"
