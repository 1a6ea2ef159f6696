"""`classification`: one label per example, logits [B, num_classes]."""
from __future__ import annotations

from types import ModuleType
from typing import Any, Mapping, Optional

from tpu_pipeline.config.model import ModelConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.model.class_targets import class_targets_loss_and_metrics
from tpu_pipeline.model.tasks.base import Task


class Classification(Task):
    """A label per example; loss and metrics per example (class ids or the soft targets of mixup and CutMix,
    or, with model.loss categorical_crossentropy, one-hot targets with label smoothing)."""

    name = "classification"
    predicts_tokens = False
    causal = False  # an encoder: every token sees the whole example

    def check_logits_width(self, num_classes: int) -> None:
        if num_classes < 2:
            raise ConfigError(f"num_classes: a classifier needs at least 2 classes, got {num_classes}")

    def loss_and_metrics(self, keras: ModuleType, config: ModelConfig,
                         byte_offset: Optional[int] = None) -> tuple[Any, list[Any]]:
        if config.loss == "categorical_crossentropy":
            loss = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=config.label_smoothing)
            return loss, [keras.metrics.CategoricalAccuracy(name="accuracy"),
                          keras.metrics.CategoricalCrossentropy(from_logits=True, label_smoothing=config.label_smoothing,
                                                                name="cross_entropy")]
        # Class ids, or the soft targets mixup and CutMix make of them (evaluation keeps the ids).
        return class_targets_loss_and_metrics(keras)

    def trained_figures(self, history: Mapping[str, list[float]]) -> list[str]:
        # Training batches carry no padding, so Keras's loss (with any regularization terms) is the figure.
        return ["loss", "accuracy"]
