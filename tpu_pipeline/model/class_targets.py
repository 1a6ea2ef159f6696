"""A classifier's loss and metrics that take either kind of target: class ids, or soft targets.

Mixup and CutMix (`{op: mixup_cutmix}`) turn a training batch's class ids into soft targets [batch,
classes] that sum to 1, while its evaluation keeps class ids. One compiled model sees both, so the
loss and metrics decide per call, from the static shapes: targets as wide as the logits (and wider
than 1) are soft, anything else is class ids.

- soft: the loss and `cross_entropy` are the cross-entropy against the soft targets (their label
  smoothing was applied where they were mixed); `accuracy` is against each example's dominant class
  (argmax), as timm and DeiT report it.
- class ids: exactly Keras's SparseCategoricalCrossentropy and SparseCategoricalAccuracy (these
  subclass them), so an evaluation, and a run without mixing, computes what it computed before.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

from tpu_pipeline.model.tensor_ops import tensor_ops


def are_soft(y_true: Any, y_pred: Any) -> bool:
    """Soft targets: the same rank as the logits and as wide (a width of 1 is a column of class ids)."""
    true_shape, pred_shape = tuple(y_true.shape), tuple(y_pred.shape)
    return (len(true_shape) == len(pred_shape) and len(true_shape) >= 2 and true_shape[-1] is not None
            and true_shape[-1] == pred_shape[-1] and true_shape[-1] > 1)


def class_targets_loss_and_metrics(keras: ModuleType) -> tuple[Any, list[Any]]:
    """(loss, [accuracy, cross_entropy]) for logits, over class ids or soft targets, under tf_keras or Keras 3."""
    categorical = keras.losses.categorical_crossentropy
    argmax = tensor_ops(keras).argmax  # keras.ops under Keras 3, tf under tf_keras

    class ClassCrossEntropy(keras.losses.SparseCategoricalCrossentropy):
        """Cross-entropy from logits against class ids (Keras's own) or soft targets."""

        def call(self, y_true: Any, y_pred: Any) -> Any:
            if are_soft(y_true, y_pred):
                return categorical(y_true, y_pred, from_logits=True)
            return super().call(y_true, y_pred)

    class ClassAccuracy(keras.metrics.SparseCategoricalAccuracy):
        """Accuracy against the class id, or a soft target's dominant class."""

        def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
            if are_soft(y_true, y_pred):
                y_true = argmax(y_true, axis=-1)
            return super().update_state(y_true, y_pred, sample_weight=sample_weight)

    class ClassCrossEntropyMetric(keras.metrics.SparseCategoricalCrossentropy):
        """The mean cross-entropy over the weighted examples, against class ids or soft targets."""

        def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
            if are_soft(y_true, y_pred):
                values = categorical(y_true, y_pred, from_logits=True)
                return keras.metrics.Mean.update_state(self, values, sample_weight=sample_weight)
            return super().update_state(y_true, y_pred, sample_weight=sample_weight)

    return ClassCrossEntropy(from_logits=True), [ClassAccuracy(name="accuracy"),
                                                 ClassCrossEntropyMetric(from_logits=True, name="cross_entropy")]

