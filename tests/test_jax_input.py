"""How a host's batches reach Keras 3's JAX trainer (cluster/jax_input.py): read-only numpy views of the
tf batches, which JAX places without a copy, and every pass from the stream's start (no peeked batch
yielded again, which would break an exact resume)."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from helpers import small_config, write_small_shards
from jax_child import requires_jax, run_jax
from tpu_pipeline.config import config_from_dict
from tpu_pipeline.pipeline import Pipeline

pytestmark = [pytest.mark.tf_builds, requires_jax]


def test_the_trainer_gets_our_batches_as_views_placed_without_a_copy():
    result = run_jax('''
        import numpy as np
        import tensorflow as tf
        from keras.src.backend.jax.trainer import JAXEpochIterator, _distribute_data
        from tpu_pipeline.cluster.jax_devices import per_host_batches, resolve_jax
        from tpu_pipeline.config.cluster import ClusterConfig
        from tpu_pipeline.demo import demo_config
        from tpu_pipeline.pipeline import Pipeline

        info = resolve_jax(ClusterConfig(cpu_replicas=8))
        pipeline = Pipeline.from_config(demo_config(["data.batch_size=64"]).data)
        adapter = info.strategy.distribute_datasets_from_function(lambda context: pipeline.build(context))
        expected = [tuple(x.numpy() for x in batch)
                    for batch in per_host_batches(pipeline.build(info.strategy.input_context()), 8).take(3)]

        views = next(adapter.get_jax_iterator())
        placed = _distribute_data(views)  # what the trainer does with each batch the adapter yields
        aliased = [shard.data.unsafe_buffer_pointer() == view.ctypes.data
                   for array, view in zip(placed, views) for shard in array.addressable_shards[:1]]
        passes = [[tuple(np.asarray(x) for x in batch) for _, batch in zip(range(3), adapter.get_jax_iterator())]
                  for _ in range(2)]
        trained = JAXEpochIterator(x=adapter, steps_per_epoch=3)._get_iterator()  # as fit pulls it
        global_batches = [tuple(np.asarray(x) for x in next(trained)) for _ in range(3)]
        emit({
            "read_only": [not v.flags.writeable for v in views],
            "aliased": aliased,
            "iterates_tf": all(isinstance(x, tf.Tensor) for x in next(iter(adapter))),
            "element_spec": str(adapter.element_spec == per_host_batches(pipeline.build(info.strategy.input_context()), 8).element_spec),
            "passes_equal": [all(np.array_equal(a, b) for a, b in zip(got, want))
                             for one_pass in passes for got, want in zip(one_pass, expected)],
            "global_equal": [all(np.array_equal(a, b) for a, b in zip(got, want))
                             for got, want in zip(global_batches, expected)],
        })
    ''')
    assert result["read_only"] == [True, True]
    assert result["aliased"] == [True, True], "JAX copied the views: the hand-off saves nothing"
    assert result["iterates_tf"] and result["element_spec"] == "True"
    assert result["passes_equal"] == [True] * 6, "a pass did not start at the stream's first batch"
    assert result["global_equal"] == [True] * 3


# In process (Keras 3 on the TensorFlow backend, as this test process has it): the adapter is a tf.data adapter
# of Keras's, which needs no JAX to hand out its numpy batches.


def _small_batches(directory: str) -> tf.data.Dataset:
    files, _ = write_small_shards(directory, 160, 4)
    return Pipeline.from_config(config_from_dict({"data": small_config(files, batch_size=32)}).data).build()


def _numpy(batch: Any) -> list[np.ndarray]:
    return [np.asarray(x) for x in tf.nest.flatten(batch)]


def test_the_adapter_hands_out_read_only_views_of_the_tf_batches(tmp_path) -> None:
    """Every array the adapter yields is read-only: a writable one is a copy (np.array), which JAX's CPU client
    copies once more (it aliases only read-only arrays), the very cost the adapter exists to save."""
    from tpu_pipeline.cluster.jax_input import host_batches

    dataset = _small_batches(str(tmp_path))
    expected = [_numpy(batch) for batch in dataset]
    batches = [tf.nest.flatten(batch) for batch in host_batches(dataset).get_jax_iterator()]
    assert len(batches) == len(expected) == 5
    for got, want in zip(batches, expected):
        assert all(isinstance(array, np.ndarray) for array in got)
        assert [array.flags.writeable for array in got] == [False] * len(want), "a copy, not a view of the tf batch"
        assert all(np.array_equal(array, value) for array, value in zip(got, want))


def test_every_pass_over_the_adapter_starts_at_the_streams_first_batch(tmp_path) -> None:
    """Keras's trainer takes a new iterator per epoch (and one for its symbolic build); a pass that went on where
    the last one stopped would shift every batch of the next epoch, and an exact resume with it."""
    from tpu_pipeline.cluster.jax_input import host_batches

    dataset = _small_batches(str(tmp_path))
    expected = [_numpy(batch) for batch in dataset]
    adapter = host_batches(dataset)
    next(adapter.get_jax_iterator())  # a pass left after its first batch
    passes = [[_numpy(batch) for batch in adapter.get_jax_iterator()] for _ in range(2)]
    assert [len(one_pass) for one_pass in passes] == [len(expected)] * 2, "a pass did not start at the first batch"
    assert all(np.array_equal(a, b) for one_pass in passes for got, want in zip(one_pass, expected)
               for a, b in zip(got, want))
