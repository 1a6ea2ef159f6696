"""Metrics of a language model, per target token and weighed by sample weights.

Keras's `weighted_metrics` divide by the sum of the weights, so with per-token weights (1 for a real
target token, 0 for padding and for the zero rows of an exact evaluation) every real token counts
once and padding never. Perplexity and bits per byte are functions of the mean cross-entropy, kept
as metrics of their own so that `fit`'s logs, the epoch line and metrics.json all carry them.

Under Keras 3 they are written in `keras.ops`, so one code serves its TensorFlow and JAX backends;
under tf_keras in the tf ops they always had.
"""
from __future__ import annotations

import math
from types import ModuleType
from typing import Any, Optional

from tpu_pipeline.model.tensor_ops import tensor_ops


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
    ops = tensor_ops(keras)

    class Perplexity(keras.metrics.SparseCategoricalCrossentropy):
        """exp(mean cross-entropy per token): the mean is taken first, as perplexity is defined."""

        def result(self) -> Any:
            return ops.exp(super().result())

    return Perplexity(from_logits=True, name="perplexity")


def _bits_per_byte(keras: ModuleType, byte_offset: int) -> Any:
    ops = tensor_ops(keras)

    class BitsPerByte(keras.metrics.Metric):
        """Bits to encode the text, per UTF-8 byte of it: the cross-entropy of every target (EOS
        included: the model must also say where a document ends) in bits, divided by the number of
        targets that are bytes. Comparable across tokenizers and with published byte-level figures."""

        def __init__(self, name: str = "bits_per_byte", **kwargs: Any) -> None:
            super().__init__(name=name, **kwargs)
            self.bits = self.add_weight(name="bits", initializer="zeros", dtype="float32")
            self.bytes = self.add_weight(name="bytes", initializer="zeros", dtype="float32")

        def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
            targets = ops.cast(y_true, "int32")
            losses = ops.sparse_categorical_crossentropy(targets, ops.cast(y_pred, "float32"), from_logits=True)
            weights = ops.ones_like(losses) if sample_weight is None else ops.broadcast_to(
                ops.cast(sample_weight, "float32"), ops.shape(losses))
            is_byte = ops.cast(targets >= byte_offset, "float32")
            self.bits.assign_add(ops.sum(losses * weights) / math.log(2.0))
            self.bytes.assign_add(ops.sum(is_byte * weights))

        def result(self) -> Any:
            return ops.divide_no_nan(self.bits, self.bytes)

        def reset_state(self) -> None:
            self.bits.assign(0.0)
            self.bytes.assign(0.0)

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "byte_offset": byte_offset}

    return BitsPerByte()
