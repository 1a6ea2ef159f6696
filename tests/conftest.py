"""Test session setup: split the one CPU into 8 logical devices before TensorFlow initializes.

Tests that need several replicas use `tf.distribute.MirroredStrategy(cpu_devices)` over these
logical devices; everything else sees them as one ordinary CPU host.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

NUM_LOGICAL_CPUS = 8

pytest_plugins = ["pytester"]  # tests/test_testing_plugin.py runs a user's test session

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(NUM_LOGICAL_CPUS)]
)


@pytest.fixture(scope="session")
def cpu_devices() -> list[str]:
    """Names of the 8 logical CPU devices, e.g. for MirroredStrategy(devices=...)."""
    return [d.name for d in tf.config.list_logical_devices("CPU")]


@pytest.fixture(scope="session")
def eight_replica_strategy(cpu_devices) -> tf.distribute.Strategy:
    """A real MirroredStrategy with 8 replicas over the logical CPUs.

    Taken from the resolver, which keeps one strategy per device set: a second MirroredStrategy
    over the same devices in this process would collide with the first's collective keys.
    """
    from tpu_pipeline.cluster.resolver import mirrored_strategy

    strategy = mirrored_strategy(cpu_devices)
    assert strategy.num_replicas_in_sync == NUM_LOGICAL_CPUS
    return strategy


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory) -> str:
    """One cache directory for the built-in demo set, shared by every test that runs the demo."""
    return str(tmp_path_factory.mktemp("demo_cache"))
