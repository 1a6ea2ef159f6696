#!/usr/bin/env bash
# The benchmark's InputReader baseline: tensorflow/models without its (large) dependency tree.
# Kept out of the package's dependencies on purpose (see the issue); run once after setup_env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
.venv/bin/python -m pip install --quiet -e ".[bench]"
.venv/bin/python -m pip install --quiet --no-deps tf-models-official
