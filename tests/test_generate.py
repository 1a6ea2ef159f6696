"""`generate` (sampling from a language model) against stub models whose next token is known.

The stub's logits at each position favour (that position's token + 1), so a greedy continuation of
any prompt is a count upwards; it also records what it was given, to check the rows generate builds
(the prompt's last `length` tokens, segment ids 1 on the text, positions from 0).
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.model.generate import generate

pytestmark = pytest.mark.tf_builds

VOCAB = 50


class CountingUp:
    """logits[b, i] = one-hot(tokens[b, i] + 1) × `sharpness` (a Keras-like callable with input names)."""

    input_names = ["inputs", "inputs_segment_ids", "inputs_positions"]

    def __init__(self, sharpness: float = 10.0) -> None:
        self.sharpness = sharpness
        self.calls: list[dict[str, np.ndarray]] = []

    def __call__(self, inputs: dict, training: bool = False) -> np.ndarray:
        assert training is False
        self.calls.append({name: np.array(value) for name, value in inputs.items()})
        tokens = np.asarray(inputs["inputs"])
        return np.eye(VOCAB, dtype=np.float32)[(tokens + 1) % VOCAB] * self.sharpness


def test_greedy_continues_the_prompt_from_its_last_token():
    model = CountingUp()
    assert generate(model, [7, 3, 4], length=8, new_tokens=6, temperature=0) == [5, 6, 7, 8, 9, 10]
    first, last = model.calls[0], model.calls[-1]
    assert first["inputs"].tolist() == [[7, 3, 4, 0, 0, 0, 0, 0]]
    assert first["inputs_segment_ids"].tolist() == [[1, 1, 1, 0, 0, 0, 0, 0]]
    assert first["inputs_positions"].tolist() == [[0, 1, 2, 0, 0, 0, 0, 0]]
    # the last call's row is full: prompt and continuation, positions from 0
    assert len(model.calls) == 6 and last["inputs"].tolist() == [[7, 3, 4, 5, 6, 7, 8, 9]]
    assert last["inputs_segment_ids"].tolist() == [[1] * 8]
    assert last["inputs_positions"].tolist() == [list(range(8))]


def test_a_prompt_longer_than_the_row_keeps_its_last_tokens():
    model = CountingUp()
    prompt = list(range(20, 40))
    assert generate(model, prompt, length=8, new_tokens=3, temperature=0) == [40, 41, 42]
    assert model.calls[0]["inputs"].tolist() == [list(range(32, 40))]
    assert model.calls[-1]["inputs"].tolist() == [list(range(34, 42))]
    assert model.calls[-1]["inputs_segment_ids"].tolist() == [[1] * 8]


def test_the_stop_id_ends_the_continuation_and_is_not_returned():
    model = CountingUp()
    assert generate(model, [1, 2], length=16, new_tokens=10, temperature=0, stop_id=6) == [3, 4, 5]
    assert len(model.calls) == 4  # the call that produced the stop id, and none after it
    assert generate(CountingUp(), [1, 2], length=16, new_tokens=10, temperature=0, stop_id=5 + VOCAB) == list(range(3, 13))


def test_sampling_is_reproducible_by_seed_and_differs_across_seeds():
    flat = CountingUp(sharpness=0.5)  # a flat distribution: samples vary
    runs = {seed: generate(flat, [1], length=8, new_tokens=24, temperature=1.0, seed=seed) for seed in (0, 1)}
    assert generate(flat, [1], length=8, new_tokens=24, temperature=1.0, seed=0) == runs[0]
    assert runs[0] != runs[1]
    assert all(0 <= token < VOCAB for token in runs[0] + runs[1])
    # a sharp model at a low temperature follows its argmax, whatever the seed
    assert generate(CountingUp(sharpness=50.0), [1], length=8, new_tokens=5, temperature=0.1, seed=3) == [2, 3, 4, 5, 6]


def test_a_keras_model_of_token_ids_only_gets_a_row_of_ids():
    """A functional Keras model with one `inputs` input (no segment ids, positions or mask): generate
    passes only what the model takes, and its greedy choice is the model's argmax."""
    keras = tf.keras
    tokens = keras.Input(shape=(8,), dtype="int32", name="inputs")
    logits = keras.layers.Lambda(lambda t: tf.one_hot((t + 2) % VOCAB, VOCAB) * 10.0)(tokens)
    model = keras.Model(tokens, logits)
    assert generate(model, [10, 11], length=8, new_tokens=4, temperature=0) == [13, 15, 17, 19]


def test_an_empty_prompt_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^generate: the prompt is empty; give at least one token id"):
        generate(CountingUp(), [], length=8, new_tokens=2, temperature=0)
