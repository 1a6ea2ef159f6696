"""`language_model`: the next token at every position, logits [B, L, vocabulary], causal attention."""
from __future__ import annotations

from types import ModuleType
from typing import Any, Mapping, Optional

from tpu_pipeline.config.model import ModelConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.model.metrics import language_model_metrics
from tpu_pipeline.model.tasks.base import Task


class LanguageModel(Task):
    """Targets are token ids, one per position, weights one per token (0 on padding), so the same sparse
    cross-entropy is per token and its metrics (`token_accuracy`, `perplexity`, `bits_per_byte` with a
    byte offset) count each real token once."""

    name = "language_model"
    predicts_tokens = True
    causal = True  # a decoder: position i sees positions <= i only

    def check_logits_width(self, num_classes: int) -> None:
        if num_classes < 2:
            raise ConfigError(f"num_classes: a language model's logits are its vocabulary, at least 2 tokens, got "
                              f"{num_classes}; set train.num_classes (or model.transformer.vocab_size)")

    def loss_and_metrics(self, keras: ModuleType, config: ModelConfig,
                         byte_offset: Optional[int] = None) -> tuple[Any, list[Any]]:
        if config.loss != "sparse_categorical_crossentropy":
            raise ConfigError(f"model.loss={config.loss!r}: a language model predicts token ids; use "
                              "sparse_categorical_crossentropy (the default)")
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True), language_model_metrics(keras, byte_offset)

    def reported(self, logs: Mapping[str, Any]) -> dict[str, Any]:
        """As every task's, and `loss` is the `cross_entropy` metric, weighted by the token weights: Keras's
        loss tracker divides by every slot of the batch, padding included (its `loss` was 4.17 where the
        nats per real token were 5.56 at 75% real tokens, and perplexity != exp(loss))."""
        shown = super().reported(logs)
        if "cross_entropy" in logs:
            shown["loss"] = logs["cross_entropy"]
        return shown

    def trained_figures(self, history: Mapping[str, list[float]]) -> list[str]:
        return ["loss", "token_accuracy", "perplexity", *(["bits_per_byte"] if "bits_per_byte" in history else [])]
