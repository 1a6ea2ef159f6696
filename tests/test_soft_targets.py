"""Training on the soft targets mixup and CutMix make: the classifier's loss is the cross-entropy against them and
its accuracy is against each example's dominant class, checked against plain Keras on the same batch (tf_keras and
Keras 3); class ids give exactly what Keras's sparse loss and metrics give (an exact evaluation is unchanged); and
`train` runs a config that mixes its batches and evaluates on class ids."""
from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import load_config
from tpu_pipeline.config.model import ModelConfig
from tpu_pipeline.model.architectures import build_network
from tpu_pipeline.model.tasks import task_named
from tpu_pipeline.ops import get_op

from test_train import DEMO_CONFIG, small_demo, small_overrides  # noqa: F401  (small_demo: a module fixture)

pytestmark = pytest.mark.tf_builds

CLASSES = 4


def keras_module(name: str):
    if name == "tf_keras":
        from tpu_pipeline.model import tf_keras
        return tf_keras
    import keras
    return keras


def batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Images, their class ids, and the soft targets mixup_cutmix makes of them (label smoothing 0.1)."""
    images = tf.random.stateless_uniform([16, 12, 12, 3], [seed, 1])
    ids = tf.random.stateless_uniform([16], [seed, 2], maxval=CLASSES, dtype=tf.int32)
    mixed = get_op("mixup_cutmix").build({"num_classes": CLASSES})({"image": images, "label": ids},
                                                                   tf.constant([seed, 3], tf.int64))
    soft = mixed["label"].numpy()
    assert not np.allclose(soft.max(axis=1), 1 - 0.1 + 0.1 / CLASSES), "the batch must really be mixed"
    return mixed["image"].numpy(), ids.numpy(), soft


@pytest.mark.parametrize("framework", ["tf_keras", "keras3"])
def test_the_loss_and_metrics_are_plain_keras_on_the_same_batch(framework):
    keras = keras_module(framework)
    config = ModelConfig.from_dict({"architecture": "cnn", "cnn": {"filters": [4]}, "keras": framework})
    model = build_network(keras, config, [12, 12, 3], CLASSES)
    loss, metrics = task_named("classification").loss_and_metrics(keras, config)
    model.compile(optimizer="sgd", loss=loss, weighted_metrics=metrics)
    images, ids, soft = batch()
    logits = model(images, training=False)
    soft_figures = model.evaluate(images, soft, batch_size=16, return_dict=True, verbose=0)
    plain_soft = float(keras.losses.CategoricalCrossentropy(from_logits=True)(soft, logits))
    assert soft_figures["loss"] == pytest.approx(plain_soft, rel=1e-5)
    assert soft_figures["cross_entropy"] == pytest.approx(plain_soft, rel=1e-5)
    dominant = float(np.mean(np.argmax(soft, axis=1) == np.argmax(np.asarray(logits), axis=1)))
    assert soft_figures["accuracy"] == pytest.approx(dominant)
    id_figures = model.evaluate(images, ids, batch_size=16, return_dict=True, verbose=0)
    plain_ids = float(keras.losses.SparseCategoricalCrossentropy(from_logits=True)(ids, logits))
    assert id_figures["loss"] == pytest.approx(plain_ids, rel=1e-5)
    assert id_figures["accuracy"] == pytest.approx(float(np.mean(ids == np.argmax(np.asarray(logits), axis=1))))
    history = model.fit(images, soft, batch_size=8, epochs=1, verbose=0).history
    assert math.isfinite(history["loss"][-1])


def test_train_mixes_its_batches_and_evaluates_on_class_ids(small_demo, tmp_path):  # noqa: F811
    from tpu_pipeline.train import train

    mix = "{op: mixup_cutmix, num_classes: 4, mixup_alpha: 0.8, cutmix_alpha: 1.0, label_smoothing: 0.1}"
    config = load_config(DEMO_CONFIG, small_overrides(small_demo, str(tmp_path / "run")) + [
        "train.epochs=1", "train.steps_per_epoch=3", "train.tensorboard=false", "model.cnn.filters=[8]",
        f"data.augment=[{{op: random_flip, key: image}}, {mix}]"])
    lines: list[str] = []
    metrics = train(config, printer=lines.append)
    assert all(math.isfinite(metrics[key]) for key in ("loss", "accuracy", "eval_loss", "eval_accuracy")), metrics
    assert 0 <= metrics["eval_accuracy"] <= 1
