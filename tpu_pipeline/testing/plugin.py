"""The pytest side: logical CPUs split at start-up, and the `cpu_strategy` fixture."""
from __future__ import annotations

import warnings
from typing import Any

import pytest

DEFAULT_CPUS = 8


def pytest_addoption(parser: Any) -> None:
    parser.addini("tpu_pipeline_cpus", "logical CPU devices for the cpu_strategy fixture", default=str(DEFAULT_CPUS))


def pytest_configure(config: Any) -> None:
    """Splits the CPU now: once TensorFlow has run an op, it can no longer be split."""
    import tensorflow as tf

    count = int(config.getini("tpu_pipeline_cpus"))
    cpu = tf.config.list_physical_devices("CPU")[0]
    existing = tf.config.get_logical_device_configuration(cpu)
    if existing is not None:
        return  # split already (e.g. by your own conftest): cpu_strategy uses what is there
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError:
        warnings.warn("tpu_pipeline.testing: TensorFlow started before the plugin could split the CPU, so "
                      "cpu_strategy has one replica; list the plugin in the top conftest.py, before TF runs")


@pytest.fixture(scope="session")
def cpu_strategy() -> Any:
    """A real MirroredStrategy over the logical CPUs (one per device set and process)."""
    import tensorflow as tf

    from tpu_pipeline.cluster.resolver import mirrored_strategy

    return mirrored_strategy([device.name for device in tf.config.list_logical_devices("CPU")])
