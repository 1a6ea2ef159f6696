"""A distributed iterator's per-device buffers run without tf.data's autotuner (runtime/device_buffers.py).

TensorFlow builds one small pipeline per device under a MirroredStrategy or TPUStrategy, with default
options: each ran an autotuning thread, and deleting the iterator waited out their sleeps (seconds to
minutes, at the end of every `fit` and evaluation on several replicas). The rule must hold for the
iterators `train` and Keras make (`strategy.distribute_datasets_from_function` called directly, as the
runner does) and for `Pipeline.distribute`, leave the host pipeline's own tuning alone, and change no
batch.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.pipeline import ArraySource, Batch, Pipeline
from tpu_pipeline.pipeline.runtime.device_buffers import untune_device_buffers

pytestmark = pytest.mark.tf_builds


def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
    dataset = tf.data.Dataset.range(64).map(lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(context.get_per_replica_batch_size(16))


def device_datasets(iterator) -> list[tf.data.Dataset]:
    """The per-device pipelines behind a distributed iterator (TensorFlow's MultiDeviceIterator, one host)."""
    (worker,) = iterator._iterators
    return [device_iterator._dataset for device_iterator in worker._iterator._device_iterators]


def first_steps(distributed, steps: int) -> list[np.ndarray]:
    iterator = iter(distributed)
    return [np.concatenate([part.numpy() for part in next(iterator).values]) for _ in range(steps)]


def test_every_device_pipeline_runs_without_the_autotuner_and_the_host_keeps_it(eight_replica_strategy):
    iterator = iter(eight_replica_strategy.distribute_datasets_from_function(dataset_fn))
    datasets = device_datasets(iterator)
    assert len(datasets) == 8
    assert [d.options().autotune.enabled for d in datasets] == [False] * 8
    assert iterator._iterators[0]._dataset.options().autotune.enabled is not False  # the host pipeline's own

    pipeline = Pipeline(source=ArraySource({"x": np.arange(64, dtype=np.int64)}), stages=[Batch(16)])
    from_pipeline = iter(pipeline.distribute(eight_replica_strategy))
    assert [d.options().autotune.enabled for d in device_datasets(from_pipeline)] == [False] * 8


def test_the_rule_changes_no_batch(eight_replica_strategy):
    try:
        untune_device_buffers(enabled=False)
        as_tensorflow_builds_it = first_steps(eight_replica_strategy.distribute_datasets_from_function(dataset_fn), 4)
    finally:
        untune_device_buffers()
    with_the_rule = first_steps(eight_replica_strategy.distribute_datasets_from_function(dataset_fn), 4)
    assert all(np.array_equal(a, b) for a, b in zip(as_tensorflow_builds_it, with_the_rule))
    assert np.array_equal(np.concatenate(with_the_rule), np.arange(64) * 2)
