"""Each stage alone, the one stage interface (a user's own stage in a Pipeline), and the tf.data
options mapping."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config.data import OptionsConfig
from tpu_pipeline.pipeline import ArraySource, Batch, Cache, MapFeatures, Pipeline, Prefetch, Repeat, Shuffle, make_options
from tpu_pipeline.pipeline.stages.base import Stage, StageContext

pytestmark = pytest.mark.tf_builds


def test_options_map_to_current_tf_data_names():
    options = make_options(OptionsConfig(
        autotune=False, cpu_budget=2, ram_budget=1 << 30, private_threadpool_size=4, max_intra_op_parallelism=1,
        deterministic=False, map_parallelization=True, auto_shard_policy="off", slack=True,
    ))
    assert options.autotune.enabled is False
    assert options.autotune.cpu_budget == 2 and options.autotune.ram_budget == 1 << 30
    assert options.threading.private_threadpool_size == 4
    assert options.threading.max_intra_op_parallelism == 1
    assert options.deterministic is False
    assert options.experimental_optimization.map_parallelization is True
    assert options.experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF
    assert options.experimental_slack is True
    defaults = make_options(OptionsConfig())
    assert defaults.deterministic is None and defaults.threading.private_threadpool_size is None


def test_array_source_shards_in_equal_slices_or_by_element():
    arrays = {"x": np.arange(11, dtype=np.int32)}
    context = tf.distribute.InputContext(2, 1, 2)
    assert [int(e["x"]) for e in ArraySource(arrays).build(context)] == [5, 6, 7, 8, 9]  # 11 // 2; 10 left out
    assert ArraySource(arrays).epoch_length(context) == 5
    values = [int(e["x"]) for e in ArraySource(arrays, sharding="element").build(context)]
    assert values == [1, 3, 5, 7, 9]


def test_stages_compose_by_hand():
    arrays = {"x": np.arange(12, dtype=np.float32)}
    square = lambda features, seed=None: {**features, "x": features["x"] ** 2}  # noqa: E731
    pipeline = Pipeline(ArraySource(arrays), [
        MapFeatures(ops=[square], deterministic=True),
        Cache(),
        Shuffle(buffer_size=12, seed=3),
        Repeat(2),
        Batch(global_batch_size=8, drop_remainder=True),
        Prefetch(2),
    ])
    batches = [b["x"].numpy() for b in pipeline.build(tf.distribute.InputContext(1, 0, 2))]
    assert [b.shape for b in batches] == [(4,)] * 6  # per-replica 8 / 2 replicas; 24 elements
    values = np.concatenate(batches)
    assert sorted(values.tolist()) == sorted((np.arange(12.0) ** 2).tolist() * 2)


def test_random_ops_get_distinct_per_element_seeds():
    arrays = {"x": np.zeros(64, dtype=np.float32)}
    noise = lambda features, seed=None: {**features, "x": tf.random.stateless_uniform([], seed)}  # noqa: E731
    stage = MapFeatures(ops=[noise], random_ops=[True], seed=5, deterministic=True)
    run = lambda: [float(e["x"]) for e in stage.apply(ArraySource(arrays).build(tf.distribute.InputContext()), StageContext())]  # noqa: E731
    first = run()
    assert len(set(first)) == 64
    assert first == run()


def test_map_features_checks_its_flags():
    with pytest.raises(ValueError):
        MapFeatures(ops=[lambda f, s=None: f], random_ops=[True, False])


class _Recorder(Stage):
    """A user's own stage: it sees what every stage sees, the context, and changes nothing."""

    def __init__(self) -> None:
        self.seen: list[StageContext] = []

    uses_epoch = True

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        self.seen.append(context)
        return dataset.map(lambda features: {**features, "x": features["x"] + 0})


def test_a_users_stage_gets_the_context_every_stage_gets():
    """The engine applies every stage one way: before the repeat a stage sees its epoch; after a
    Batch, a resumed stream's position counts batches (examples // batch), the input pipeline always."""
    arrays = {"x": np.arange(16, dtype=np.float32)}
    early, late = _Recorder(), _Recorder()
    pipeline = Pipeline(ArraySource(arrays), [early, Repeat(3), Batch(global_batch_size=4), late])
    context = tf.distribute.InputContext(2, 1, 2)
    resumed = [b["x"].numpy().tolist() for b in pipeline.build(context, start=10)]
    whole = [b["x"].numpy().tolist() for b in pipeline.build(context)]
    assert resumed == whole[5:]  # 10 examples = 5 batches of 2 per replica
    assert all(c.input is context and c.epoch is not None for c in early.seen)
    first, last = late.seen[0], late.seen[-1]
    assert (first.examples, first.unit, first.position) == (10, 2, 5) and first.epoch is None
    assert (last.examples, last.position) == (0, 0) and last.input_pipeline_id == 1


def test_a_pipeline_refuses_what_is_not_a_stage():
    with pytest.raises(TypeError, match="is not a stage: a stage has apply.dataset, context. and after.context."):
        Pipeline(ArraySource({"x": np.arange(4)}), [lambda dataset: dataset])
