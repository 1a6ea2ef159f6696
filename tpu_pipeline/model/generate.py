"""Sampling from a trained language model: the next token of a prompt, again and again.

Deliberately plain (one forward pass over the whole row per new token, no key/value cache): it is
for looking at what a model learned, in a notebook or a test, not for serving.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from tpu_pipeline.errors import ConfigError


def _input_names(model: Any) -> set[str]:
    """What the model takes: tf_keras's `input_names`, else (Keras 3 has none) its inputs' names."""
    names = getattr(model, "input_names", None)
    if not names:
        names = [getattr(tensor, "name", None) for tensor in getattr(model, "inputs", None) or []]
    return {name for name in names if name}


def generate(model: Any, prompt: Sequence[int], *, length: int, new_tokens: int, temperature: float = 0.8,
             stop_id: Optional[int] = None, seed: int = 0, tokens_key: str = "inputs") -> list[int]:
    """The prompt's continuation: `new_tokens` ids sampled one at a time (greedy at temperature 0),
    ending early at `stop_id` (e.g. the tokenizer's EOS). The model takes rows of `length` tokens as
    `train` gave them: `<tokens_key>`, its `_segment_ids` (1 on the text, 0 after) and `_positions`;
    a prompt longer than `length` keeps its last tokens."""
    ids = list(prompt)
    if not ids:  # the model predicts from the last prompt token: with none it would read a padding slot
        raise ConfigError("generate: the prompt is empty; give at least one token id "
                          "(the start of the text to continue)")
    rng = np.random.default_rng(seed)
    out: list[int] = []
    names = _input_names(model) or {tokens_key}
    for _ in range(new_tokens):
        window = ids[-length:]
        used = len(window)
        row = np.zeros([1, length], np.int32)
        row[0, :used] = window
        inputs = {tokens_key: row}
        if f"{tokens_key}_segment_ids" in names:
            inputs[f"{tokens_key}_segment_ids"] = (np.arange(length) < used).astype(np.int32)[None]
        if f"{tokens_key}_positions" in names:
            inputs[f"{tokens_key}_positions"] = np.where(np.arange(length) < used, np.arange(length), 0).astype(np.int32)[None]
        if f"{tokens_key}_mask" in names:
            inputs[f"{tokens_key}_mask"] = (np.arange(length) < used).astype(np.int32)[None]
        logits = np.asarray(model(inputs, training=False), np.float64)[0, used - 1]
        if temperature <= 0:
            token = int(np.argmax(logits))
        else:
            scaled = (logits - logits.max()) / temperature
            probabilities = np.exp(scaled) / np.exp(scaled).sum()
            token = int(rng.choice(len(probabilities), p=probabilities))
        if stop_id is not None and token == stop_id:
            break
        ids.append(token)
        out.append(token)
    return out
