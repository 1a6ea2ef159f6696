#!/usr/bin/env bash
# Runs the suite as the README's test command does, with every test's time, and prints where the time went
# (the slowest tests, the total per file, setup against the tests' own calls): docs/testing.md quotes it.
#
#   bash scripts/test_times.sh [--tpu] [pytest args]    the log and tables stay in test-times/
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
[ "${1:-}" = "--tpu" ] && VENV=.venv-tpu
mkdir -p test-times
LOG="test-times/durations$([ "$VENV" = .venv-tpu ] && echo -tpu).log"
start=$(date +%s)
bash scripts/run_tests.sh "$@" --durations=0 -p no:cacheprovider 2>&1 | tee "$LOG" | tail -n 3 || true
echo "wall time, install included: $(( $(date +%s) - start )) s" | tee -a "$LOG"
TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -m pytest -q --collect-only -m slow -p no:cacheprovider \
  $([ "$VENV" = .venv-tpu ] && echo --tf-builds-only) > test-times/slow-ids.txt 2>/dev/null || true
"$VENV/bin/python" scripts/test_times.py "$LOG" --slow-ids test-times/slow-ids.txt | tee "${LOG%.log}.txt"
