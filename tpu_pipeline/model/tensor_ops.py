"""The few tensor ops our layers, losses and metrics are written over: `keras.ops` under Keras 3 (one code
for its TensorFlow and JAX backends), and under tf_keras, whose layers and metrics take tf tensors, the
very tf ops (so the very graphs and numbers) tf_keras ran with before Keras 3 joined.
"""
from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any

import tensorflow as tf


def _tf_ops() -> SimpleNamespace:
    return SimpleNamespace(
        cast=tf.cast, equal=tf.equal, not_equal=tf.not_equal, logical_and=tf.logical_and,
        logical_or=tf.logical_or, logical_not=tf.logical_not, broadcast_to=tf.broadcast_to,
        ones_like=tf.ones_like, einsum=tf.einsum, where=tf.where, maximum=tf.maximum,
        expand_dims=tf.expand_dims, shape=tf.shape, exp=tf.exp, divide_no_nan=tf.math.divide_no_nan,
        arange=lambda stop, dtype=None: tf.range(stop, dtype=dtype),
        argmax=lambda x, axis=-1: tf.argmax(x, axis=axis),
        softmax=lambda x, axis=-1: tf.nn.softmax(x, axis=axis),
        sum=lambda x, axis=None: tf.reduce_sum(x, axis=axis),
        sparse_categorical_crossentropy=lambda target, output, from_logits=False:
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=target, logits=output),
    )


def tensor_ops(keras: ModuleType) -> Any:
    """`keras.ops` under Keras 3, the same-named tf ops under tf_keras."""
    return getattr(keras, "ops", None) or _tf_ops()
