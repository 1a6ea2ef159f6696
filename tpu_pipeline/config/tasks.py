"""The tasks `train.task` names, and the little the config layer must know of each.

The names live here once (`TASKS`): the config validates them, and the model layer's task objects
(`tpu_pipeline.model.tasks`) are registered under them. What the config layer needs of a task is
whether its targets are token ids from the same stream as its inputs (a language model): then
`data.outputs` can be derived from `data.sequence` (`config.data.derived_outputs`), and
`train.num_classes` (the logits' width) is the vocabulary, so it must agree with
`model.transformer.vocab_size` (the embedding's rows). Loss, metrics and reported figures are the
model layer's (a config runs no TensorFlow).
"""
from __future__ import annotations

from typing import Literal, Optional, get_args

from tpu_pipeline.errors import ConfigError

TaskName = Literal["classification", "language_model"]
TASKS: tuple[str, ...] = get_args(TaskName)
# Tasks whose targets are token ids of the input stream (the next token): their logits are the vocabulary.
TOKEN_TASKS: frozenset[str] = frozenset({"language_model"})


def predicts_tokens(task: str) -> bool:
    """Whether `task`'s targets are token ids, so that train.num_classes is its vocabulary."""
    return task in TOKEN_TASKS


def check_one_vocabulary(task: str, num_classes: Optional[int], vocab_size: Optional[int]) -> None:
    """Refuses a language model whose logits (train.num_classes) and embedding (model.transformer.vocab_size)
    have different sizes: its inputs and targets are the same token ids, so one of them would not fit."""
    if predicts_tokens(task) and num_classes and vocab_size and num_classes != vocab_size:
        raise ConfigError(
            f"train.num_classes={num_classes} and model.transformer.vocab_size={vocab_size}: a language model's "
            "targets are its input token ids, so its logits and its embedding need one vocabulary; set one of them "
            "(or both to the same size)"
        )
