"""Optimizers from config (sgd with momentum, adam, adamw), driven by a learning-rate schedule."""
from __future__ import annotations

from types import ModuleType
from typing import Any

import tensorflow as tf

from tpu_pipeline.config.model import OptimizerConfig

ADAMW_DEFAULT_WEIGHT_DECAY = 0.004  # Keras's AdamW default.
# Decaying norm scales/offsets and biases hurts accuracy; the usual practice exempts them.
NO_DECAY_NAMES = ["bias", "gamma", "beta"]


def build_optimizer(keras: ModuleType, config: OptimizerConfig, learning_rate: Any) -> Any:
    """Returns a new Keras optimizer; create it inside `strategy.scope()` so its slots are mirrored."""
    weight_decay = config.weight_decay
    if weight_decay is None:
        weight_decay = ADAMW_DEFAULT_WEIGHT_DECAY if config.name == "adamw" else 0.0
    common: dict[str, Any] = dict(learning_rate=learning_rate, global_clipnorm=config.global_clipnorm)
    if weight_decay:
        common["weight_decay"] = weight_decay
    if config.name == "sgd":
        optimizer = keras.optimizers.SGD(momentum=config.momentum, nesterov=config.nesterov, **common)
    else:
        cls = keras.optimizers.Adam if config.name == "adam" else keras.optimizers.AdamW
        if config.name == "adamw":
            common["weight_decay"] = weight_decay  # AdamW's own default would otherwise apply.
        optimizer = cls(beta_1=config.beta_1, beta_2=config.beta_2, epsilon=config.epsilon, **common)
    if weight_decay:
        optimizer.exclude_from_weight_decay(var_names=NO_DECAY_NAMES)
    if config.global_clipnorm:
        clip_summed_slices(optimizer)
    return optimizer


def clip_summed_slices(optimizer: Any) -> None:
    """Makes the clip measure an embedding's gradient as the dense gradient it stands for (also used by
    benchmarks/bench_lm_quality.py on its plain Keras reference).

    On TensorFlow an embedding lookup's gradient is a `tf.IndexedSlices` with one row per occurrence of
    a token, and both tf_keras and Keras 3 clip (`_clip_gradients`) before anything sums the rows of
    repeated tokens: the norm they read is that of the rows as they are. It came out smaller than the
    gradient's (8.75 for 10.50 on text_lm's first batch), the clip triggered later than on Keras 3 with
    JAX (whose gradients are dense), and the two frameworks trained apart from the same weights (issue 47
    item 1, benchmarks/README.md). Summing the rows first makes the norm the true one, and what the
    optimizer applies is the same gradient. JAX's gradients pass through untouched.
    """
    clip = getattr(optimizer, "_clip_gradients", None)
    if clip is None:
        return

    def clip_summed(grads: Any) -> Any:
        return clip([summed_slices(grad) for grad in grads])

    optimizer._clip_gradients = clip_summed


def summed_slices(grad: Any) -> Any:
    """`grad` with the rows of each repeated index summed into one, if it is a `tf.IndexedSlices`."""
    if not isinstance(grad, tf.IndexedSlices):
        return grad
    indices, positions = tf.unique(grad.indices)
    values = tf.math.unsorted_segment_sum(grad.values, positions, tf.shape(indices)[0])
    return tf.IndexedSlices(values, indices, grad.dense_shape)
