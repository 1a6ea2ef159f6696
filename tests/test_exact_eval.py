"""Exact evaluation: every example once, on any number of replicas and input pipelines, with static
shapes (the last batch padded with zero-weight examples), and Keras metrics that ignore the padding."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.pipeline import Pipeline

from helpers import small_config, write_small_shards


def eval_pipeline(files: str, batch_size: int) -> Pipeline:
    data = small_config(files, batch_size=batch_size, drop_remainder=True, shuffle={"enabled": False},
                        outputs={"inputs": "features", "targets": "id"})
    return Pipeline.from_config(config_from_dict({"data": data}).data).for_evaluation()


def weighted_ids(pipeline: Pipeline, context: tf.distribute.InputContext) -> tuple[list[int], int, set]:
    ids, elements, shapes = [], 0, set()
    for inputs, targets, weights in pipeline.build(context):
        elements += 1
        shapes.add(tuple(inputs.shape))
        ids.extend(int(i) for i, w in zip(targets.numpy(), weights.numpy()) if w == 1.0)
        assert all(w == 0.0 for w in weights.numpy()[int(weights.numpy().sum()):])
    return ids, elements, shapes


@pytest.mark.parametrize("num, pipelines", [(100, 1), (101, 2), (7, 2)])
def test_every_example_once_and_the_same_steps_on_every_pipeline(tmp_path, num, pipelines):
    files, _ = write_small_shards(tmp_path / "data", num, 3)
    pipeline = eval_pipeline(files, batch_size=32)  # 8 replicas: 4 examples a replica
    steps = pipeline.evaluation_steps(num_replicas=8, num_input_pipelines=pipelines)
    seen = []
    for index in range(pipelines):
        ids, elements, shapes = weighted_ids(pipeline, tf.distribute.InputContext(pipelines, index, 8))
        assert elements == steps * 8 // pipelines  # one element per replica per step, alike on every pipeline
        assert shapes == {(4, 16)}  # static: the partial batch is padded
        seen.extend(ids)
    assert sorted(seen) == list(range(num))
    assert steps == -(-num // 32) if pipelines == 1 else steps >= -(-num // 32)


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
