"""The environment the suite runs in holds what a TPU needs, and TensorFlow starts on a machine with no TPU.

CI runs the suite twice (.ci/run): in .venv (the registry's TensorFlow) and in .venv-tpu
(`scripts/setup_env.sh --tpu`: tensorflow-tpu with the libtpu it pins). These tests check the second
as pip left it, and that `import tensorflow` through the package neither hangs (libtpu retrying the
metadata server) nor aborts (a mismatched libtpu) here, where there is no TPU device.
"""
from __future__ import annotations

import importlib.metadata as metadata
import os
import subprocess
import sys
import time

import pytest

from tpu_pipeline import tensorflow_install

pytestmark = pytest.mark.tf_builds

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTALL = tensorflow_install.installed()
tpu_only = pytest.mark.skipif(not INSTALL.is_tpu_distribution, reason="runs in .venv-tpu (bash scripts/run_tests.sh --tpu)")


def test_exactly_one_tensorflow_distribution():
    """Two distributions (tensorflow + tensorflow-tpu) would write one tensorflow/ folder: whichever came last wins."""
    assert len(INSTALL.tensorflow) == 1, INSTALL.describe()


@tpu_only
def test_tpu_environment_pins_hold():
    """The TPU TensorFlow's own libtpu pin holds, and tf-keras is of its minor (it went in with --no-deps)."""
    (name, version), = INSTALL.tensorflow
    assert (name, version) == ("tensorflow-tpu", tensorflow_install.TESTED_TPU_TENSORFLOW)
    assert INSTALL.libtpu_pin == f"=={tensorflow_install.TESTED_LIBTPU}"
    assert INSTALL.libtpu == tensorflow_install.TESTED_LIBTPU
    assert tensorflow_install.libtpu_mismatch(INSTALL) is None
    assert INSTALL.tf_keras.split(".")[:2] == version.split(".")[:2]
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("tensorflow")


@tpu_only
def test_setup_script_pins_match_the_package():
    """scripts/setup_env.sh and tensorflow_install name the same TPU TensorFlow and libtpu."""
    with open(os.path.join(REPO, "scripts", "setup_env.sh"), encoding="utf-8") as handle:
        script = handle.read()
    assert f'TPU_TENSORFLOW="tensorflow-tpu=={tensorflow_install.TESTED_TPU_TENSORFLOW}"' in script
    assert f'TPU_LIBTPU="libtpu=={tensorflow_install.TESTED_LIBTPU}"' in script


def test_tensorflow_starts_through_the_package_with_no_tpu():
    """In a fresh process, with TPU_LOAD_LIBRARY unset (the .pth of .venv-tpu removed from play), importing the
    package first makes TensorFlow start without libtpu: a CPU op runs and the process ends. The timeout only
    turns a hang (libtpu retrying the metadata server for minutes) into a failure; nothing asserts a time."""
    code = ("import os; os.environ.pop('TPU_LOAD_LIBRARY', None)\n"
            "import tpu_pipeline, tensorflow as tf\n"
            "print(os.environ.get('TPU_LOAD_LIBRARY'), int(tf.reduce_sum(tf.range(10))))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_")}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["0", "45"]
    print(f"import took {time.monotonic() - started:.1f} s")  # reported with -s; never asserted
