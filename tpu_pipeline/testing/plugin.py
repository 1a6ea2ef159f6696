"""The pytest side: logical CPUs split at start-up, and the `cpu_strategy` fixture."""
from __future__ import annotations

import warnings
from typing import Any

import pytest

DEFAULT_CPUS = 8


def pytest_addoption(parser: Any) -> None:
    parser.addini("tpu_pipeline_cpus", "logical CPU devices for the cpu_strategy fixture", default=str(DEFAULT_CPUS))


def pytest_configure(config: Any) -> None:
    """Splits the CPU now: once TensorFlow has run an op, it can no longer be split. TF starts here,
    its start-up lines (CUDA probing on a CPU host, oneDNN) silenced unless TF_CPP_MIN_LOG_LEVEL is yours."""
    from tpu_pipeline.system import native_stderr_silenced
    from tpu_pipeline.testing import tf_log_level

    with native_stderr_silenced(not tf_log_level.USER_SET):
        _split_cpu(int(config.getini("tpu_pipeline_cpus")))


def _split_cpu(count: int) -> None:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    if tf.config.get_logical_device_configuration(cpu) is None:  # else split already (e.g. by your conftest)
        try:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
        except RuntimeError:
            warnings.warn("tpu_pipeline.testing: TensorFlow started before the plugin could split the CPU, so "
                          "cpu_strategy has one replica; list the plugin in the top conftest.py, before TF runs")
    tf.config.list_logical_devices()  # starts TF's context (and its device probing) now, while silenced


@pytest.fixture(scope="session")
def cpu_strategy() -> Any:
    """A real MirroredStrategy over the logical CPUs (one per device set and process)."""
    import tensorflow as tf

    from tpu_pipeline.cluster.resolver import mirrored_strategy

    return mirrored_strategy([device.name for device in tf.config.list_logical_devices("CPU")])
