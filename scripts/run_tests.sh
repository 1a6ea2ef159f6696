#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite (CPU only; 8 logical CPU replicas).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
# Two worker processes (pytest-xdist): the tests not marked slow run together on one, in order, while
# the slow ones (child processes the test mostly waits on) run one by one on whichever is free
# (tests/conftest.py groups them). TEST_WORKERS=0 runs everything in this one process.
exec .venv/bin/python -m pytest -q -n "${TEST_WORKERS:-2}" --dist loadgroup "$@"
