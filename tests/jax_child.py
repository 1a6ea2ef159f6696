"""Runs a snippet of Python under Keras 3's JAX backend in a child process, for the JAX tests.

Keras 3 picks its backend once per process, at its first import, and this test process has already
imported it with the TensorFlow backend (the `model.keras: keras3` tests); JAX also takes
`--xla_force_host_platform_device_count` only before it starts. So each JAX test runs its code in a
fresh interpreter: `KERAS_BACKEND=jax`, 8 JAX CPU devices, and what the snippet prints on its last line
(JSON) comes back.

    result = run_jax('''
        import jax
        emit({"devices": len(jax.devices())})
    ''')
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any, Mapping, Optional

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_JAX_DEVICES = 8
_MARK = "JAX_CHILD_RESULT "


def jax_installed() -> bool:
    """Whether this environment has the `jax` extra (.venv has it; the TPU TensorFlow's .venv-tpu does not)."""
    try:
        import importlib.util

        return importlib.util.find_spec("jax") is not None
    except ValueError:  # pragma: no cover
        return False


requires_jax = pytest.mark.skipif(
    not jax_installed(),
    reason="the jax extra is not installed here (.venv-tpu is the TPUStrategy path; .venv runs the JAX tests)",
)

_PRELUDE = """
import json as _json, sys as _sys
def emit(value):
    print({mark!r} + _json.dumps(value), flush=True)
"""


def jax_env(devices: int = NUM_JAX_DEVICES, extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """The environment of a JAX child: the JAX backend and `devices` CPU devices, quiet TensorFlow."""
    env = dict(os.environ)
    env.pop("TF_USE_LEGACY_KERAS", None)
    env.update({
        "KERAS_BACKEND": "jax",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": REPO + os.pathsep + env.get("PYTHONPATH", ""),
    })
    env.update(extra or {})
    return env


def run_jax(code: str, *, devices: int = NUM_JAX_DEVICES, timeout: float = 600,
            env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None) -> Any:
    """Runs `code` (dedented) in a JAX child; returns what it passed to `emit(...)` last. A child that
    fails, or emits nothing, fails the test with its output."""
    script = _PRELUDE.format(mark=_MARK) + textwrap.dedent(code)
    completed = subprocess.run([sys.executable, "-c", script], env=jax_env(devices, env), cwd=cwd or REPO,
                               capture_output=True, text=True, timeout=timeout)
    results = [line[len(_MARK):] for line in completed.stdout.splitlines() if line.startswith(_MARK)]
    if completed.returncode != 0 or not results:
        pytest.fail(f"JAX child exited {completed.returncode}:\n{completed.stdout[-4000:]}\n{completed.stderr[-6000:]}")
    return json.loads(results[-1])
