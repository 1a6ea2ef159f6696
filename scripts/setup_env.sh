#!/usr/bin/env bash
# Creates .venv (Python 3.11 if present) and installs the package with its test extras.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# Reinstall only when setup.cfg changed since the last install (the stamp holds its hash): every
# `pip install -e` rebuilds the package and prints setuptools' editable-install notice.
STAMP=".venv/.installed-$(sha256sum setup.cfg | cut -c1-16)"
if [ ! -f "$STAMP" ] || ! .venv/bin/python -c "import tpu_pipeline" 2>/dev/null; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[test,notebook,text]"
  rm -f .venv/.installed-*
  touch "$STAMP"
fi
