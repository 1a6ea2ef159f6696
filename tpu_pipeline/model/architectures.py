"""Networks from config: an MLP, a small CNN, a ResNet and a Transformer. Uncompiled; logits out, in float32.

Each builder takes the Keras module (`keras_backend.get_keras`) so the same code builds for
tf_keras or Keras 3. The last Dense layer has dtype float32, so under a mixed policy the logits
(and the softmax inside the loss) stay in float32.

The inputs are one tensor (`input_shape` a list, e.g. [32, 32, 3]) or a dict of int32 tensors
(`input_shape` {name: shape}, e.g. a sequence batch's `tokens`, `tokens_segment_ids`,
`tokens_positions`); only the transformer and your own model (model.fn) take a dict.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from tpu_pipeline.config.model import BatchNormConfig, ModelConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.model.tasks import Task, task_named
from tpu_pipeline.model.transformer import build_transformer
from tpu_pipeline.model.user_models import ModelFn, build_application, call_model_fn, load_model_fn

InputShape = Union[Sequence[Optional[int]], Mapping[str, Sequence[Optional[int]]]]


def _synchronized(keras: ModuleType, bn: BatchNormConfig) -> bool:
    """batch_norm.synchronized where it means something: under tf.distribute each replica sees its own
    slice of the batch. On JAX the batch is one global array sharded over the devices, so its
    statistics are the global batch's already, and Keras 3 refuses the flag off TensorFlow."""
    return bn.synchronized and keras.backend.backend() == "tensorflow"


def _norm(keras: ModuleType, bn: BatchNormConfig, name: str, zero_init: bool = False) -> Any:
    """BatchNorm with the configured statistics; zero gamma on a residual branch's last norm."""
    return keras.layers.BatchNormalization(
        momentum=bn.momentum,
        epsilon=bn.epsilon,
        synchronized=_synchronized(keras, bn),
        gamma_initializer="zeros" if zero_init else "ones",
        name=name,
    )


def _conv(keras: ModuleType, filters: int, size: int, stride: int, name: str) -> Any:
    return keras.layers.Conv2D(
        filters, size, strides=stride, padding="same", use_bias=False,
        kernel_initializer="he_normal", name=name,
    )


def _logits(keras: ModuleType, x: Any, num_classes: int) -> Any:
    return keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)


def _require_image(config: ModelConfig, input_shape: Sequence[int]) -> None:
    if len(input_shape) != 3:
        raise ConfigError(
            f"model.architecture: {config.architecture!r} needs image inputs [height, width, channels], "
            f"but input_shape is {list(input_shape)}; use architecture 'mlp' for flat features"
        )


def build_mlp(keras: ModuleType, config: ModelConfig, inputs: Any, num_classes: int) -> Any:
    x = keras.layers.Flatten(name="flatten")(inputs) if len(inputs.shape) > 2 else inputs
    for i, units in enumerate(config.mlp.hidden_units):
        x = keras.layers.Dense(units, activation="relu", name=f"dense_{i}")(x)
        if config.mlp.dropout:
            x = keras.layers.Dropout(config.mlp.dropout, name=f"dropout_{i}")(x)
    return _logits(keras, x, num_classes)


def build_cnn(keras: ModuleType, config: ModelConfig, inputs: Any, num_classes: int) -> Any:
    x = inputs
    for i, filters in enumerate(config.cnn.filters):
        x = _conv(keras, filters, 3, 1, name=f"conv_{i}")(x)
        x = _norm(keras, config.batch_norm, name=f"bn_{i}")(x)
        x = keras.layers.ReLU(name=f"relu_{i}")(x)
        x = keras.layers.MaxPooling2D(2, padding="same", name=f"pool_{i}")(x)
    x = keras.layers.GlobalAveragePooling2D(name="global_pool")(x)
    if config.cnn.dropout:
        x = keras.layers.Dropout(config.cnn.dropout, name="dropout")(x)
    return _logits(keras, x, num_classes)


def _residual_block(keras: ModuleType, config: ModelConfig, x: Any, filters: int, stride: int,
                    name: str) -> Any:
    """Basic (3x3, 3x3) or bottleneck (1x1, 3x3/stride, 1x1 x4) block, projection when shapes change."""
    bn = config.batch_norm
    bottleneck = config.resnet.block == "bottleneck"
    out_filters = filters * 4 if bottleneck else filters
    shortcut = x
    if stride != 1 or x.shape[-1] != out_filters:
        shortcut = _conv(keras, out_filters, 1, stride, name=f"{name}_proj")(x)
        shortcut = _norm(keras, bn, name=f"{name}_proj_bn")(shortcut)
    if bottleneck:
        plan = [(filters, 1, 1), (filters, 3, stride), (out_filters, 1, 1)]
    else:
        plan = [(filters, 3, stride), (filters, 3, 1)]
    y = x
    for j, (f, size, s) in enumerate(plan):
        last = j == len(plan) - 1
        y = _conv(keras, f, size, s, name=f"{name}_conv{j}")(y)
        y = _norm(keras, bn, name=f"{name}_bn{j}", zero_init=last)(y)
        if not last:
            y = keras.layers.ReLU(name=f"{name}_relu{j}")(y)
    y = keras.layers.Add(name=f"{name}_add")([shortcut, y])
    return keras.layers.ReLU(name=f"{name}_out")(y)


def build_resnet(keras: ModuleType, config: ModelConfig, inputs: Any, num_classes: int) -> Any:
    cfg = config.resnet
    if cfg.stem == "imagenet":
        x = _conv(keras, cfg.width, 7, 2, name="stem_conv")(inputs)
    else:
        x = _conv(keras, cfg.width, 3, 1, name="stem_conv")(inputs)
    x = _norm(keras, config.batch_norm, name="stem_bn")(x)
    x = keras.layers.ReLU(name="stem_relu")(x)
    if cfg.stem == "imagenet":
        x = keras.layers.MaxPooling2D(3, strides=2, padding="same", name="stem_pool")(x)
    for stage, blocks in enumerate(cfg.blocks_per_stage):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            x = _residual_block(keras, config, x, cfg.width * 2**stage, stride, f"stage{stage}_block{block}")
    x = keras.layers.GlobalAveragePooling2D(name="global_pool")(x)
    return _logits(keras, x, num_classes)


ARCHITECTURES: dict[str, Callable[[ModuleType, ModelConfig, Any, int], Any]] = {
    "mlp": build_mlp,
    "cnn": build_cnn,
    "resnet": build_resnet,
}


def _check_shape(shape: Sequence[Optional[int]], where: str) -> None:
    if not shape or any(d is not None and (not isinstance(d, int) or d <= 0) for d in shape):
        raise ConfigError(f"{where}: needs positive static sizes (no batch dimension), got {list(shape)}")


def _check_inputs(input_shape: InputShape) -> None:
    """Every shape is a non-empty list of positive sizes (None: a length that varies, bucket mode)."""
    if not isinstance(input_shape, Mapping):
        _check_shape(input_shape, "input_shape")
        return
    if not input_shape:
        raise ConfigError("input_shape: the dict of inputs is empty; give {input name: shape}")
    for name, shape in input_shape.items():
        _check_shape(shape, f"input_shape[{name!r}]")


def _build_transformer_network(keras: ModuleType, config: ModelConfig, input_shape: InputShape, num_classes: int,
                               task: Task) -> Any:
    """int32 inputs, one per name (a list shape is the token ids alone: one example per row, no padding)."""
    if isinstance(input_shape, Mapping):
        inputs = {name: keras.Input(shape=tuple(shape), dtype="int32", name=name)
                  for name, shape in input_shape.items()}
        model_inputs: Any = inputs
    else:
        if len(input_shape) != 1:
            raise ConfigError(f"model.architecture: 'transformer' takes token ids [length] per example, but "
                              f"input_shape is {list(input_shape)}; feed a sequence batch (data.sequence)")
        model_inputs = keras.Input(shape=tuple(input_shape), dtype="int32", name="inputs")
        inputs = {"inputs": model_inputs}
    outputs = build_transformer(keras, config, inputs, num_classes, task)
    return keras.Model(model_inputs, outputs, name="transformer")


def build_network(keras: ModuleType, config: ModelConfig, input_shape: InputShape, num_classes: int,
                  model_fn: Optional[ModelFn] = None, *, task: Union[str, Task] = "classification") -> Any:
    """Builds the uncompiled model: `model_fn` (from Python), `config.fn`, `config.application`, or the
    built-in network named by `config.architecture`.

    Args:
      input_shape: one example's shape without the batch dimension, e.g. [32, 32, 3]; or a dict
        {input name: shape}, e.g. {"tokens": [256], "tokens_segment_ids": [256], "tokens_positions":
        [256]} (None for a length that varies per bucket), each an int32 input of the model.
      num_classes: the logits' width: classes, or a language model's vocabulary.
      model_fn: fn(input_shape=<the list or dict>, num_classes=N[, task=...]) -> Keras model.
      task: 'classification' (logits [B, num_classes]) or 'language_model' (logits [B, L, num_classes]), or a
        `model.tasks.Task` object.

    Call it inside `strategy.scope()` and the dtype policy you want (build_model does both).
    """
    task = task_named(task)
    task.check_logits_width(num_classes)
    _check_inputs(input_shape)
    if model_fn is not None:  # a user's model may take a length that varies (data.sequence bucket mode)
        return call_model_fn(keras, model_fn, input_shape, num_classes, "model_fn", task=task.name)
    if config.fn is not None:
        return call_model_fn(keras, load_model_fn(config.fn), input_shape, num_classes,
                             f"model.fn={config.fn!r}", task=task.name)
    if config.application is None and config.architecture == "transformer":
        return _build_transformer_network(keras, config, input_shape, num_classes, task)
    name = f"model.application={config.application!r}" if config.application else \
        f"model.architecture={config.architecture!r}"
    if isinstance(input_shape, Mapping):
        raise ConfigError(f"{name} takes one input tensor, but the inputs are a dict {sorted(input_shape)}; use "
                          "model.architecture: transformer for token sequences, or your own model.fn")
    if task.predicts_tokens:
        raise ConfigError(f"train.task={task.name!r} needs model.architecture: transformer (or model.fn); {name} is a "
                          "classifier")
    if any(d is None for d in input_shape):
        raise ConfigError(f"input_shape: {name} needs static sizes, got {list(input_shape)} (data.sequence bucket "
                          "mode varies the length per bucket): use model.fn, or data.sequence.mode pad or pack")
    if config.application is not None:
        return build_application(keras, config.application, config.weights, input_shape, num_classes)
    if config.architecture != "mlp":
        _require_image(config, input_shape)
    inputs = keras.Input(shape=tuple(int(d) for d in input_shape), name="inputs")
    outputs = ARCHITECTURES[config.architecture](keras, config, inputs, num_classes)
    return keras.Model(inputs, outputs, name=config.architecture)
