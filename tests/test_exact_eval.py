"""Exact evaluation: every example once, on any number of replicas and input pipelines, with static
shapes (the last batch padded with zero-weight examples), and Keras metrics that ignore the padding."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.pipeline import Pipeline

from helpers import small_config, write_small_shards

pytestmark = pytest.mark.tf_builds


def eval_pipeline(files: str, batch_size: int) -> Pipeline:
    data = small_config(files, batch_size=batch_size, drop_remainder=True, shuffle={"enabled": False},
                        outputs={"inputs": "features", "targets": "id"})
    return Pipeline.from_config(config_from_dict({"data": data}).data).for_evaluation()


def weighted_ids(pipeline: Pipeline, context: tf.distribute.InputContext) -> tuple[list[int], int, set, int]:
    """(ids of the rows of weight 1, elements, input shapes, padding rows inside partly real batches).

    A padding row is all zeros, a real one random normal floats: so each weight is checked against
    what its row is, not against the weights themselves (a row of padding with weight 1 fails)."""
    ids, elements, shapes, padding = [], 0, set(), 0
    for inputs, targets, weights in pipeline.build(context):
        elements += 1
        shapes.add(tuple(inputs.shape))
        real = inputs.numpy().any(axis=1)
        np.testing.assert_array_equal(weights.numpy(), real.astype(np.float32),
                                      err_msg="weight 1 for each real row, 0 for each row of padding")
        assert not real[int(real.sum()):].any(), f"padding comes after the real rows: {real}"
        ids.extend(int(i) for i, w in zip(targets.numpy(), weights.numpy()) if w == 1.0)
        if 0 < real.sum() < len(real):
            padding += len(real) - int(real.sum())
    return ids, elements, shapes, padding


@pytest.mark.parametrize("num, pipelines", [(100, 1), (101, 2), (7, 2)])
def test_every_example_once_and_the_same_steps_on_every_pipeline(tmp_path, num, pipelines):
    files, _ = write_small_shards(tmp_path / "data", num, 3)
    pipeline = eval_pipeline(files, batch_size=32)  # 8 replicas: 4 examples a replica
    steps = pipeline.evaluation_steps(num_replicas=8, num_input_pipelines=pipelines)
    seen, padding = [], 0
    for index in range(pipelines):
        ids, elements, shapes, rows = weighted_ids(pipeline, tf.distribute.InputContext(pipelines, index, 8))
        assert elements == steps * 8 // pipelines  # one element per replica per step, alike on every pipeline
        assert shapes == {(4, 16)}  # static: the partial batch is padded
        assert rows == -len(ids) % 4, f"pipeline {index}: {len(ids)} examples, {rows} rows of padding in its last batch"
        seen.extend(ids)
        padding += rows
    assert sorted(seen) == list(range(num))
    if num % 4:  # 4 examples a replica: a partial batch exists, so the padding checks above checked something
        assert padding > 0
    assert steps == -(-num // 32) if pipelines == 1 else steps >= -(-num // 32)


def test_the_last_partial_batch_is_padded_with_zero_weight_rows(tmp_path):
    """30 examples at 4 a replica: 7 full batches, then 2 real rows and 2 of padding. Without a partial
    batch in the data a padding check has nothing to check."""
    num, per_replica = 30, 4
    assert num % per_replica == 2
    files, values = write_small_shards(tmp_path / "data", num, 3)
    pipeline = eval_pipeline(files, batch_size=8 * per_replica)
    assert pipeline.evaluation_steps(num_replicas=8) == 1
    elements = [tuple(t.numpy() for t in element) for element in pipeline.build(tf.distribute.InputContext(1, 0, 8))]
    assert len(elements) == 8
    assert all(weights.tolist() == [1.0] * 4 for _, _, weights in elements[:7])
    inputs, targets, weights = elements[7]
    assert weights.tolist() == [1.0, 1.0, 0.0, 0.0], "the 2 rows of padding must weigh nothing"
    np.testing.assert_array_equal(inputs[:2], values[targets[:2]])
    assert not inputs[2:].any() and not targets[2:].any()
    assert sorted(int(i) for _, ids, w in elements for i, x in zip(ids, w) if x == 1.0) == list(range(num))


def test_keras_evaluate_on_eight_replicas_counts_every_example_once(tmp_path, eight_replica_strategy):
    from tpu_pipeline.config.model import ModelConfig
    from tpu_pipeline.model import build_model

    num = 100  # not a multiple of the global batch of 32
    files, values = write_small_shards(tmp_path / "data", num, 3)
    data = small_config(files, batch_size=32, shuffle={"enabled": False}, outputs={"inputs": "features", "targets": "label"},
                        augment=[{"op": "cast", "key": "label", "dtype": "int32"}])
    pipeline = Pipeline.from_config(config_from_dict({"data": data}).data).for_evaluation()
    model = build_model(ModelConfig(architecture="mlp", mlp={"hidden_units": [8]}), strategy=eight_replica_strategy,
                        kind="cpu", input_shape=[16], num_classes=3, steps_per_epoch=4, epochs=1)
    result = model.evaluate(pipeline.distribute(eight_replica_strategy), steps=pipeline.evaluation_steps(8),
                            verbose=0, return_dict=True)
    logits = model.predict(values, verbose=0)
    labels = np.arange(num) % 3
    expected_accuracy = float(np.mean(np.argmax(logits, axis=1) == labels))
    expected_loss = float(tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)))
    assert result["accuracy"] == pytest.approx(expected_accuracy, abs=1e-6)
    assert result["cross_entropy"] == pytest.approx(expected_loss, rel=1e-4)
