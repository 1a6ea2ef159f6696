"""How a host's batches reach Keras 3's JAX trainer (cluster/jax_input.py): read-only numpy views of the
tf batches, which JAX places without a copy, and every pass from the stream's start (no peeked batch
yielded again, which would break an exact resume)."""
from __future__ import annotations

from jax_child import requires_jax, run_jax

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
