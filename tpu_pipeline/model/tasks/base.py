"""`Task`: what one `train.task` decides, in one object: its logits, loss and metrics, and what `train` reports.

Everything that differs between a classifier and a language model asks the task object, so nothing
compares task names, and a new task is one new module (a `Task` subclass, `register`ed under a name of
`config.tasks.TASKS`). Each method is small and pure: the model layer builds with it, the train layer
reports with it.
"""
from __future__ import annotations

import abc
from types import ModuleType
from typing import Any, ClassVar, Mapping, Optional

from tpu_pipeline.config.model import ModelConfig


class Task(abc.ABC):
    """One training task. Subclasses set the class attributes and implement `check_logits_width`,
    `loss_and_metrics` and `trained_figures`."""

    name: ClassVar[str]
    # Whether the targets are token ids of the input stream, one per position: logits [B, L, vocabulary]
    # (so train.num_classes is the vocabulary) instead of [B, num_classes] per example.
    predicts_tokens: ClassVar[bool] = False
    causal: ClassVar[bool] = False  # a Transformer's attention when model.transformer.causal is unset

    @abc.abstractmethod
    def check_logits_width(self, num_classes: int) -> None:
        """Refuses, in one line, a logits width this task cannot train (a ConfigError)."""

    @abc.abstractmethod
    def loss_and_metrics(self, keras: ModuleType, config: ModelConfig,
                         byte_offset: Optional[int] = None) -> tuple[Any, list[Any]]:
        """The loss, and the metrics `compile` weighs by sample weights (`weighted_metrics`): an exact
        evaluation pads its last batch with zero-weight examples, which plain metrics and Keras's loss
        tracker would count. Among them `cross_entropy`, the loss over the weighted examples only (no
        regularization terms): what `reported` and `evaluation_figures` call the loss.
        `byte_offset`: for byte-level token ids, the id of byte 0 (ids below it are special tokens)."""

    @abc.abstractmethod
    def trained_figures(self, history: Mapping[str, list[float]]) -> list[str]:
        """The names of the last epoch's training figures metrics.json reports: loss and the task's own."""

    def reported(self, logs: Mapping[str, Any]) -> dict[str, Any]:
        """Keras's logs under the names and meanings `train` reports (step and epoch lines, history):
        `val_loss` is the exact validation loss (`val_cross_entropy`), since an exact evaluation pads its
        last steps and Keras's loss tracker counts the padding; `cross_entropy` itself is not shown. The
        training `loss` stays Keras's unless the task says otherwise."""
        shown = dict(logs)
        shown.pop("cross_entropy", None)
        if "val_cross_entropy" in shown:
            shown["val_loss"] = shown.pop("val_cross_entropy")
        return self._in_order(shown)

    def _in_order(self, shown: dict[str, Any]) -> dict[str, Any]:
        """One order whichever Keras logged: the task's own figures (the loss first), then any other
        alphabetically, then the validation ones alike. Keras 3 on JAX logs its metrics alphabetically and
        tf_keras loss first, so the same run's lines read differently on the two frameworks."""
        trained = [name for name in self.trained_figures(shown) if name in shown]
        others = sorted(name for name in shown if not name.startswith("val_") and name not in trained)
        order = trained + others
        order += [f"val_{name}" for name in order if f"val_{name}" in shown]
        order += sorted(name for name in shown if name not in order)
        return {name: shown[name] for name in order}

    def evaluation_figures(self, evaluation: Mapping[str, Any]) -> dict[str, float]:
        """metrics.json's `eval_*` figures from `model.evaluate(return_dict=True)`: `eval_loss` is the
        weighted `cross_entropy` (Keras's `loss` would count the padding), then every other metric."""
        figures = {"eval_loss": float(evaluation["cross_entropy"])}
        figures.update({f"eval_{name}": float(value) for name, value in evaluation.items()
                        if name not in ("loss", "cross_entropy")})
        return figures

    def __repr__(self) -> str:
        return f"<task {self.name}>"
