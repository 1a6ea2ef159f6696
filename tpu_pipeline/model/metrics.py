"""Metrics of a language model, per target token and weighed by sample weights.

Keras's `weighted_metrics` divide by the sum of the weights, so with per-token weights (1 for a real
target token, 0 for padding and for the zero rows of an exact evaluation) every real token counts
once and padding never. Perplexity and bits per byte are functions of the mean cross-entropy, kept
as metrics of their own so that `fit`'s logs, the epoch line and metrics.json all carry them.
"""
from __future__ import annotations

import math
from types import ModuleType
from typing import Any, Optional

import tensorflow as tf


def language_model_metrics(keras: ModuleType, byte_offset: Optional[int] = None) -> list[Any]:
    """token_accuracy, cross_entropy (nats per token), perplexity, and bits_per_byte when the ids are
    bytes (`byte_offset`: the id of byte 0; smaller ids are special tokens such as EOS)."""
    metrics = [
        keras.metrics.SparseCategoricalAccuracy(name="token_accuracy"),
        keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="cross_entropy"),
        _perplexity(keras),
    ]
    if byte_offset is not None:
        metrics.append(_bits_per_byte(keras, byte_offset))
    return metrics


def _perplexity(keras: ModuleType) -> Any:
    class Perplexity(keras.metrics.SparseCategoricalCrossentropy):
        """exp(mean cross-entropy per token): the mean is taken first, as perplexity is defined."""

        def result(self) -> Any:
            return tf.exp(super().result())

    return Perplexity(from_logits=True, name="perplexity")


def _bits_per_byte(keras: ModuleType, byte_offset: int) -> Any:
    class BitsPerByte(keras.metrics.Metric):
        """Bits to encode the text, per UTF-8 byte of it: the cross-entropy of every target (EOS
        included: the model must also say where a document ends) in bits, divided by the number of
        targets that are bytes. Comparable across tokenizers and with published byte-level figures."""

        def __init__(self, name: str = "bits_per_byte", **kwargs: Any) -> None:
            super().__init__(name=name, **kwargs)
            self.bits = self.add_weight(name="bits", initializer="zeros", dtype="float32")
            self.bytes = self.add_weight(name="bytes", initializer="zeros", dtype="float32")

        def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
            targets = tf.cast(y_true, tf.int32)
            losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=tf.cast(y_pred, tf.float32))
            weights = tf.ones_like(losses) if sample_weight is None else tf.broadcast_to(
                tf.cast(sample_weight, tf.float32), tf.shape(losses))
            is_byte = tf.cast(targets >= byte_offset, tf.float32)
            self.bits.assign_add(tf.reduce_sum(losses * weights) / math.log(2.0))
            self.bytes.assign_add(tf.reduce_sum(is_byte * weights))

        def result(self) -> Any:
            return tf.math.divide_no_nan(self.bits, self.bytes)

        def reset_state(self) -> None:
            self.bits.assign(0.0)
            self.bytes.assign(0.0)

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "byte_offset": byte_offset}

    return BitsPerByte()
