"""Token rows as text: the first rows a language-model pipeline delivers, each segment decoded, the trained-on
targets marked.

So a user sees exactly what the loss is taken on before paying for a TPU: `tpu-pipeline demo --config
configs/chat_sft.yaml --show 2` prints the packed conversations with each answer inside ⟦ ⟧. A mask one token off
shows at once (the newline before an answer marked, or its end-of-turn token not). Each segment is its first
input token (never a target), then its targets, grouped by weight and decoded group by group.
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from tpu_pipeline.errors import ConfigError

OPEN, CLOSE = "⟦", "⟧"


def _arrays(element: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(inputs, targets, a row's example numbers, weights) of a batch (inputs, targets[, weights]) whose inputs
    are a dict holding `inputs` (data.outputs as train.task language_model derives them). The example numbers are
    the segment ids of packed rows; a padded or bucketed row is one example, where `inputs_mask` is 1 (not where
    the weights are: with loss weights those are the answers only, and the prompt would vanish from the row)."""
    if not (isinstance(element, (tuple, list)) and len(element) >= 2 and isinstance(element[0], dict)
            and "inputs" in element[0]):
        raise ConfigError("--show on token rows reads (inputs, targets, weights) batches whose inputs hold `inputs`, as "
                          "train.task language_model derives them (lm_shift, data.sequence); set train.task")
    inputs, targets = element[0], np.asarray(element[1])
    weights = np.asarray(element[2]) if len(element) > 2 else np.ones_like(targets, np.float32)
    segments = inputs.get("inputs_segment_ids", inputs.get("inputs_mask"))
    examples = np.asarray(segments) if segments is not None else (weights > 0)
    return np.asarray(inputs["inputs"]), targets, examples.astype(np.int64), weights


def _segment_text(tokenizer: Any, first: int, targets: np.ndarray, weights: np.ndarray) -> str:
    parts = [tokenizer.decode([int(first)])]
    trained = weights > 0
    start = 0
    for end in [*np.flatnonzero(np.diff(trained.astype(np.int8))) + 1, len(targets)]:
        text = tokenizer.decode(targets[start:end].tolist())
        parts.append(f"{OPEN}{text}{CLOSE}" if trained[start] else text)
        start = end
    return "".join(parts)


def token_rows(batches: Iterable[Any], count: int, tokenizer: Any) -> str:
    """The first `count` rows of the batches, as text: a line per segment's header, then its decoded tokens."""
    lines: list[str] = []
    shown = 0
    for element in batches:
        inputs, targets, examples, weights = _arrays(element)
        for row in range(inputs.shape[0]):
            if shown == count:
                return "\n".join(lines)
            ids = examples[row]
            real = int((ids > 0).sum())
            lines.append(f"row {shown}: {real} of {len(ids)} slots hold tokens, {int((weights[row] > 0).sum())} "
                         f"targets trained on, each run of them in double brackets")
            for segment in range(1, int(ids.max(initial=0)) + 1):
                where = np.flatnonzero(ids == segment)
                if not len(where):
                    continue
                lines.append(f"--- segment {segment}: {len(where)} tokens")
                lines.append(_segment_text(tokenizer, inputs[row][where[0]], targets[row][where], weights[row][where]))
            shown += 1
    return "\n".join(lines)
