"""One meaning per figure (issue 25, item 7): the training rates count training steps only.

A run's `tokens_per_sec` once came out below every epoch's (validation and saves were in its time).
Here a real tf_keras fit with a slow validation and a real TokenMeter checks that the rates the
ProgressLogger returns (metrics.json's) are exactly what the timed steps trained divided by the time
spent in them, that validation time is not in them, and that the final figure lies within the
epochs' printed figures (it is their weighted mean).
"""
from __future__ import annotations

import time

import pytest
import tensorflow as tf

from tpu_pipeline.model import tf_keras
from tpu_pipeline.pipeline.efficiency import TokenMeter
from tpu_pipeline.pipeline.wait_meter import InputWaitMeter, metered
from tpu_pipeline.train.callbacks import ProgressLogger

BATCH, LENGTH, REAL = 4, 8, 5  # every batch: 4 rows of 8 slots, 5 real tokens per row
STEPS, EPOCHS, VALIDATION_SLEEP = 5, 3, 0.1


def _no_read_ahead(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Without prefetch, what the TokenMeter counted is exactly what the steps consumed."""
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    options.autotune.enabled = False
    return dataset.with_options(options)


def _training_stream(tokens: TokenMeter) -> tf.data.Dataset:
    segment_ids = tf.constant([[1] * REAL + [0] * (LENGTH - REAL)] * BATCH, tf.int32)
    batches = tf.data.Dataset.from_tensors({"tokens": tf.ones([BATCH, LENGTH], tf.int32),
                                            "tokens_segment_ids": segment_ids}).repeat()
    counted = tokens.apply(batches)
    return _no_read_ahead(counted.map(lambda b: (tf.cast(b["tokens"], tf.float32), tf.ones([BATCH, 1]))))


def _slow_validation() -> tf.data.Dataset:
    def slow(x, y):
        sleep = tf.ensure_shape(tf.py_function(lambda: time.sleep(VALIDATION_SLEEP) or 0.0, [], tf.float32), [])
        return x + 0.0 * sleep, y

    return _no_read_ahead(tf.data.Dataset.from_tensors((tf.ones([BATCH, LENGTH]), tf.ones([BATCH, 1]))).repeat(2).map(slow))


class _StepTimes(tf_keras.callbacks.Callback):
    """The test's own clock: each step's duration (batch begin to end) and each validation's."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[float] = []
        self.validations: list[float] = []

    def on_train_batch_begin(self, batch, logs=None):
        self._step = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append(time.perf_counter() - self._step)

    def on_test_begin(self, logs=None):
        self._test = time.perf_counter()

    def on_test_end(self, logs=None):
        self.validations.append(time.perf_counter() - self._test)


def test_training_rates_count_the_training_steps_only_and_the_final_lies_within_the_epochs():
    tokens, meter = TokenMeter(), InputWaitMeter()
    model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    lines: list[str] = []
    progress = ProgressLogger(BATCH, every=2, meter=meter, total_steps=STEPS * EPOCHS, printer=lines.append,
                              epochs_total=EPOCHS, tokens=tokens)
    clock = _StepTimes()
    model.fit(metered(_training_stream(tokens), meter), epochs=EPOCHS, steps_per_epoch=STEPS,
              validation_data=_slow_validation(), validation_steps=2, callbacks=[progress, clock], verbose=0)

    timed_steps = STEPS * EPOCHS - 1  # the first step of the fit call (tracing) is not timed
    seconds = progress.step_seconds()
    assert progress.tokens_per_second() * seconds == pytest.approx(timed_steps * BATCH * REAL)
    assert progress.examples_per_second() * seconds == pytest.approx(timed_steps * BATCH)
    # The steps' own time, as the test's callback measured it: not the first step, not the validations
    # (2 batches of at least VALIDATION_SLEEP s after each epoch, far longer than these steps).
    assert len(clock.steps) == STEPS * EPOCHS and min(clock.validations) >= 2 * VALIDATION_SLEEP
    assert seconds == pytest.approx(sum(clock.steps[1:]), rel=0.2, abs=0.01), (seconds, clock.steps)
    assert seconds < sum(clock.validations), (seconds, clock.validations)
    assert 0.0 <= progress.input_wait_fraction() <= 1.0

    epochs = [line for line in lines if line.startswith("epoch ")]
    assert len(epochs) == EPOCHS, lines
    rates = [float(line.split(" | ")[-2].split()[0].replace(",", "")) for line in epochs]
    assert min(rates) - 1 <= progress.tokens_per_second() <= max(rates) + 1, (progress.tokens_per_second(), epochs)
    assert all("non-padding 0.625" in line for line in epochs), epochs  # 5 of 8 slots
    steps = [line for line in lines if line.startswith("step ")]
    assert "is not timed" not in steps[0] and all("tokens/s" in line for line in steps), steps  # 2 steps, 1 timed


def test_a_line_with_only_the_first_step_says_it_is_not_timed():
    tokens = TokenMeter()
    model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    lines: list[str] = []
    progress = ProgressLogger(BATCH, every=1, printer=lines.append, tokens=tokens)
    model.fit(_training_stream(tokens), epochs=1, steps_per_epoch=3, callbacks=[progress], verbose=0)
    steps = [line for line in lines if line.startswith("step ")]
    assert "is not timed" in steps[0] and "tokens/s" not in steps[0], steps
    assert all("tokens/s" in line for line in steps[1:]), steps
    assert progress.tokens_per_second() * progress.step_seconds() == pytest.approx(2 * BATCH * REAL)
