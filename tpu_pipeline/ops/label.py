"""Built-in label and feature-selection ops."""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops._util import feature
from tpu_pipeline.ops.registry import register_op


@register_op("onehot", batchable=True)
def onehot(depth: int, key: str = "label", on_value: float = 1.0, off_value: float = 0.0):
    """Integer class ids to float32 one-hot vectors of length `depth`."""
    if not isinstance(depth, int) or depth < 1:
        raise ConfigError(f"op 'onehot': depth must be a positive int (the number of classes), got {depth!r}")

    def fn(features, seed=None):
        label = tf.cast(feature(features, key, "onehot"), tf.int32)
        return {**features, key: tf.one_hot(label, depth, on_value=on_value, off_value=off_value)}

    return fn


@register_op("keep", batchable=True)
def keep(keys: Sequence[str]):
    """Keeps only these features (drop file names and other strings a TPU cannot take)."""
    if isinstance(keys, str) or not keys:
        raise ConfigError(f"op 'keep': keys must be a non-empty list of feature names, got {keys!r}")

    def fn(features, seed=None):
        return {k: feature(features, k, "keep") for k in keys}

    return fn
