#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite (CPU only; 8 logical CPU replicas).
#
#   bash scripts/run_tests.sh [pytest args]         in .venv: the registry's TensorFlow (2.21)
#   bash scripts/run_tests.sh --tpu [pytest args]   in .venv-tpu: the TPU TensorFlow (2.19.1, docs/tpu.md),
#                                                   the tests marked tf_builds only (tests/suite_rule.py)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
RULE=()
if [ "${1:-}" = "--tpu" ]; then
  shift
  VENV=.venv-tpu
  # What no TensorFlow build can change ran once already, under the registry's TensorFlow (docs/testing.md).
  RULE=(--tf-builds-only)
  bash scripts/setup_env.sh --tpu
else
  bash scripts/setup_env.sh
fi
# Three worker processes (pytest-xdist) on the 2 cores: each file of in-process tests is one unit (its module
# fixtures built once, on one worker), and each test marked slow (child processes the test mostly waits on) a
# unit of its own, on whichever worker is free (tests/conftest.py). With two, the cores sat idle 15% of a CI
# run while tests waited on their children; the third fills that (docs/testing.md, "Where the time goes").
# TEST_WORKERS=N sets another number; TEST_WORKERS=0 runs everything in this process.
exec "$VENV/bin/python" -m pytest -q -n "${TEST_WORKERS:-3}" --dist loadgroup "${RULE[@]}" "$@"
