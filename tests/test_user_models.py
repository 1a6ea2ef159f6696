"""The user's own model (`model.fn`, `train(model_fn=...)`) and keras.applications models by name:
built under the strategy's scope, compiled with the configured optimizer and schedule."""
from __future__ import annotations

import sys
import textwrap

import pytest
import tensorflow as tf

from tpu_pipeline.config.model import ModelConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.model import build_model, tf_keras

pytestmark = pytest.mark.tf_builds


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(textwrap.dedent('''
        import tf_keras as keras

        def small(input_shape, num_classes):
            inputs = keras.Input(shape=input_shape)
            x = keras.layers.Flatten()(inputs)
            return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name="my_small")

        def not_a_model(input_shape, num_classes):
            return "a string"

        def no_arguments():
            return None
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("my_models", None)


def build(config: dict, strategy, input_shape=(8, 8, 3), **kwargs):
    return build_model(ModelConfig.from_dict(config), strategy=strategy, kind="cpu", input_shape=list(input_shape),
                       num_classes=5, steps_per_epoch=4, epochs=2, **kwargs)


def test_model_fn_is_built_under_the_scope_and_compiled(user_module, eight_replica_strategy):
    model = build({"fn": "my_models:small", "optimizer": {"name": "adam"}}, eight_replica_strategy)
    assert model.name == "my_small"
    assert all(isinstance(v, tf.distribute.DistributedValues) for v in model.trainable_variables)  # mirrored
    assert type(model.optimizer).__name__ == "Adam" and model.compiled_loss is not None


def test_a_python_model_fn_overrides_the_config(eight_replica_strategy):
    def mine(input_shape, num_classes):
        inputs = tf_keras.Input(shape=input_shape)
        return tf_keras.Model(inputs, tf_keras.layers.Dense(num_classes)(tf_keras.layers.Flatten()(inputs)), name="mine")

    model = build({"architecture": "cnn"}, eight_replica_strategy, model_fn=mine)
    assert model.name == "mine" and model.output_shape == (None, 5)


@pytest.mark.parametrize("spec, message", [
    ("my_models.small", r"write it as 'package.module:function'"),
    ("not_a_module_xyz:f", r"cannot import module 'not_a_module_xyz'"),
    ("my_models:missing", r"module 'my_models' has no function 'missing'"),
    ("my_models:not_a_model", r"returned str, not a tf_keras.Model"),
    ("my_models:no_arguments", r"must accept input_shape and num_classes"),
])
def test_model_fn_mistakes_are_one_line_errors(user_module, spec, message):
    with pytest.raises(ConfigError, match=message):
        build({"fn": spec}, tf.distribute.get_strategy())


def test_a_keras_application_by_name_gets_a_logits_head():
    model = build({"application": "MobileNetV3Small"}, tf.distribute.get_strategy(), input_shape=(32, 32, 3))
    assert model.output_shape == (None, 5) and model.outputs[0].dtype == "float32"
    with pytest.raises(ConfigError, match=r"with input_shape \[8, 8, 3\]: Input size must be at least 32x32"):
        build({"application": "MobileNetV3Small"}, tf.distribute.get_strategy())
    with pytest.raises(ConfigError, match=r"model.application='ResNet5O': no such model .* did you mean ResNet50"):
        build({"application": "ResNet5O"}, tf.distribute.get_strategy())


@pytest.mark.parametrize("config, message", [
    ({"fn": "a:b", "application": "ResNet50"}, "both set"),
    ({"weights": "imagenet"}, "model.application is not"),
    ({"application": "ResNet50", "architecture": "cnn"}, "model.application replaces it"),
])
def test_conflicting_model_keys_are_refused(config, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_dict(config)


def test_train_takes_a_model_fn(tmp_path):
    from helpers import write_small_shards
    from tpu_pipeline.config import config_from_dict
    from tpu_pipeline.train import train

    files, _ = write_small_shards(tmp_path / "data", 128, 2)
    built = []

    def mine(input_shape, num_classes):
        built.append((list(input_shape), num_classes))
        inputs = tf_keras.Input(shape=input_shape)
        return tf_keras.Model(inputs, tf_keras.layers.Dense(num_classes)(inputs), name="mine")

    data = {"source": {"type": "tfrecord", "files": files},
            "features": {"features": {"dtype": "float32", "shape": [16]}, "label": {"dtype": "int64"}},
            "augment": [{"op": "cast", "key": "label", "dtype": "int32"}], "repeat": "forever", "batch_size": 32,
            "outputs": {"inputs": "features", "targets": "label"}}
    config = config_from_dict({"data": data, "train": {"run_dir": str(tmp_path / "run"), "epochs": 1, "num_classes": 3,
                                                       "tensorboard": False}})
    metrics = train(config, printer=lambda line: None, model_fn=mine)
    assert built == [([16], 3)] and metrics["steps"] == 4
