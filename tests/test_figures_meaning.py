"""One meaning per figure (issue 25, item 7): the training rates count training steps only.

A run's `tokens_per_sec` once came out below every epoch's (validation and saves were in its time).
Here a real tf_keras fit with a slow validation and a real TokenMeter checks that the rates the
ProgressLogger returns (metrics.json's) are exactly what the timed steps trained divided by the time
spent in them, that validation time is not in them, and that the final figure lies within the
epochs' printed figures (it is their weighted mean).
"""
from __future__ import annotations

import json
import os
import re
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
import yaml

from tpu_pipeline.bench.doctor import ModelRate, model_verdict
from tpu_pipeline.bench.measure import Measurement, Meter, aggregate, describe, measure_to_a_new_window
from tpu_pipeline.config import config_from_dict
from tpu_pipeline.model import tf_keras
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.pipeline.runtime.wait_meter import InputWaitMeter, metered
from tpu_pipeline.pipeline.sequences.token_count import TokenMeter
from tpu_pipeline.train.callbacks import ProgressLogger

from helpers import run_together

pytestmark = pytest.mark.tf_builds

BATCH, LENGTH, REAL = 4, 8, 5  # every batch: 4 rows of 8 slots, 5 real tokens per row
STEPS, EPOCHS, VALIDATION_SLEEP = 5, 3, 0.1
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


class _Stamps(tf_keras.callbacks.Callback):
    """The times at which this callback saw each step begin and end, and each validation's duration."""

    def __init__(self) -> None:
        super().__init__()
        self.begins: list[float] = []
        self.ends: list[float] = []
        self.validations: list[float] = []

    def on_train_batch_begin(self, batch, logs=None):
        self.begins.append(time.perf_counter())

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())

    def on_test_begin(self, logs=None):
        self._test = time.perf_counter()

    def on_test_end(self, logs=None):
        self.validations.append(time.perf_counter() - self._test)


def _bracket(before: _Stamps, after: _Stamps) -> tuple[list[float], list[float]]:
    """Each step's time seen from outside the ProgressLogger and from inside it.

    Keras calls the callbacks in list order at a step's begin and at its end, so with `before` ahead of
    the ProgressLogger and `after` behind it, the logger's own span of each step lies within
    [before's begin, after's end] and contains [after's begin, before's end]: bounds that hold however
    loaded the machine is, where one clock compared with another within a tolerance does not.
    """
    outer = [end - begin for begin, end in zip(before.begins, after.ends)]
    inner = [end - begin for begin, end in zip(after.begins, before.ends)]
    return outer, inner


def test_training_rates_count_the_training_steps_only_and_the_final_lies_within_the_epochs():
    tokens, meter = TokenMeter(), InputWaitMeter()
    model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    lines: list[str] = []
    progress = ProgressLogger(BATCH, every=2, meter=meter, total_steps=STEPS * EPOCHS, printer=lines.append,
                              epochs_total=EPOCHS, tokens=tokens)
    before, after = _Stamps(), _Stamps()
    model.fit(metered(_training_stream(tokens), meter), epochs=EPOCHS, steps_per_epoch=STEPS,
              validation_data=_slow_validation(), validation_steps=2, callbacks=[before, progress, after],
              verbose=0)

    timed_steps = STEPS * EPOCHS - 1  # the first step of the fit call (tracing) is not timed
    seconds = progress.step_seconds()
    assert progress.tokens_per_second() * seconds == pytest.approx(timed_steps * BATCH * REAL)
    assert progress.examples_per_second() * seconds == pytest.approx(timed_steps * BATCH)
    # The steps' own time: not the first step (tracing, ~0.3 s), not the validations (2 batches of at least
    # VALIDATION_SLEEP s after each epoch, far longer than these steps), nothing between the steps.
    outer, inner = _bracket(before, after)
    assert len(outer) == len(inner) == STEPS * EPOCHS and min(before.validations) >= 2 * VALIDATION_SLEEP
    assert sum(inner[1:]) <= seconds <= sum(outer[1:]), (seconds, inner, outer)
    assert seconds < sum(before.validations), (seconds, before.validations)
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


# demo, bench and doctor: one measuring loop, and the output says what its figure covers.

def _token_records(directory, count: int = 200) -> str:
    rng = np.random.default_rng(0)
    path = os.path.join(str(directory), "tokens.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for _ in range(count):
            ids = tf.train.Int64List(value=rng.integers(0, 100, int(rng.integers(10, 60))).tolist())
            example = tf.train.Example(features=tf.train.Features(feature={"tokens": tf.train.Feature(int64_list=ids)}))
            writer.write(example.SerializeToString())
    return path


def _packed(files: str, window: int) -> dict:
    return {"source": {"type": "tfrecord", "files": files},
            "features": {"tokens": {"dtype": "int64", "kind": "ragged", "cast": "int32"}},
            "batch_size": 4, "repeat": "forever", "shuffle": {"enabled": False},
            "sequence": {"keys": ["tokens"], "length": 64, "mode": "pack", "window": window}}


def test_the_measurement_counts_new_windows_and_says_when_none_was_placed_while_timed(tmp_path):
    files = _token_records(tmp_path)
    small = Pipeline.from_config(config_from_dict({"data": _packed(files, 16)}).data)
    meter = Meter(small.build(with_position=True))
    assert meter.positioned and meter.warm_up(2) == 2 and meter.first_batch_seconds > 0
    runs = [meter.measure(10), meter.measure(10)]
    assert all(run.windows >= 2 for run in runs), runs  # 16 examples of 10-60 tokens: ~2 batches a window
    total = aggregate(runs)
    assert total.tokens_per_sec == pytest.approx(sum(r.real_tokens for r in runs) / sum(r.seconds for r in runs))
    assert total.windows == sum(r.windows for r in runs) and total.batches == 20
    said = describe(total, 2, meter.first_batch_seconds)
    assert f"20 batches in {total.seconds:.2f} s, after 2 warm-up batch(es)" in said
    assert f"they brought {total.windows} new pack/bucket window(s), so placing windows is in the figure" in said

    large = Pipeline.from_config(config_from_dict({"data": _packed(files, 1024)}).data)  # ~140 batches a window
    meter = Meter(large.build(with_position=True))
    meter.warm_up(2)
    run = meter.measure(10)
    assert run.windows == 0, run
    assert "every timed batch came from a pack/bucket window placed before the timing began" in describe(run, 2)
    runs = measure_to_a_new_window(meter, [run], max_seconds=120.0)  # what doctor does: 10, 10, 20, 40, ... batches
    assert runs[0] is run and runs[-1].windows >= 1 and not any(r.windows for r in runs[:-1]), runs
    assert [r.batches for r in runs] == [10 * 2 ** max(0, i - 1) for i in range(len(runs))]

    plain = Meter(Pipeline.from_config(config_from_dict({"data": {**_packed(files, 16), "sequence": {
        "keys": ["tokens"], "length": 64, "mode": "pad", "overflow": "truncate"}}}).data).build(with_position=True))
    assert not plain.positioned and plain.measure(3).windows == -1  # pad mode has no windows: nothing said


def _measurement(batches_per_sec: float, tokens_per_batch: int = 0) -> Measurement:
    seconds = 1.0
    batches = int(batches_per_sec * seconds)
    return Measurement(examples_per_sec=4 * batches_per_sec, batches_per_sec=batches_per_sec, bytes_per_sec=0.0,
                       cpu_seconds_per_example=0.0, cores_used=0.0, peak_memory_bytes=0, seconds=seconds,
                       examples=4 * batches, batches=batches, tokens_per_sec=tokens_per_batch * batches_per_sec,
                       real_tokens=tokens_per_batch * batches, token_slots=256 * batches if tokens_per_batch else 0)


def test_doctor_says_nothing_to_tune_when_the_input_outruns_the_model_and_what_to_do_when_not():
    model = ModelRate(steps_per_sec=2.0, steps=5, seconds=2.5, warmup_seconds=3.0, device="cpu, 1 replica(s)")
    ratio, lines = model_verdict(_measurement(50.0, tokens_per_batch=200), model)
    assert ratio == pytest.approx(25.0)
    assert lines[0].startswith("model: trains 2.00 steps/s = 400 tokens/s on this host (cpu, 1 replica(s); 5 step(s)")
    assert lines[1].startswith("verdict: the input pipeline delivers 25.0x what the model consumes on this host: "
                               "nothing to tune"), lines
    ratio, lines = model_verdict(_measurement(1.0), model)
    assert ratio == pytest.approx(0.5) and "= 8 examples/s" in lines[0]
    assert lines[1].startswith("verdict: the model could take 2.0x what the input pipeline delivers: the input sets "
                               "the training speed; apply the findings"), lines


def test_doctor_on_a_config_with_a_model_times_the_model_and_compares(tmp_path):
    files = _token_records(tmp_path)
    data = {**_packed(files, 16), "preprocess": [{"op": "lm_shift", "key": "tokens"}],
            "sequence": {"keys": ["inputs", "targets"], "length": 64, "mode": "pack", "window": 16},
            "outputs": {"inputs": ["inputs", "inputs_segment_ids", "inputs_positions"], "targets": "targets",
                        "weights": "targets_segment_ids"}}
    config = {"data": data, "model": {"architecture": "transformer", "transformer": {
        "width": 32, "depth": 1, "heads": 2, "mlp_dim": 64, "vocab_size": 100}},
        "train": {"task": "language_model", "run_dir": str(tmp_path / "run"), "steps_per_epoch": 10}}
    path = tmp_path / "config.yaml"
    yaml.safe_dump(config, open(path, "w"))
    out, nomodel_out = tmp_path / "doctor.json", tmp_path / "doctor_nomodel.json"
    doctor = [sys.executable, "-m", "tpu_pipeline.cli", "doctor", "--config", str(path), "--batches", "5"]
    # The two runs share nothing (each its own JSON): run side by side, not one after the other.
    result, nomodel = run_together([doctor + ["--model_steps", "3", "--json", str(out)],
                                    doctor + ["--nomodel", "--json", str(nomodel_out)]], timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.load(open(out))
    model, pipeline = report["model"], report["pipeline"]
    assert model["steps"] == 3 and model["steps_per_sec"] > 0 and model["device"].startswith("cpu")
    assert report["input_to_model_ratio"] == pytest.approx(pipeline["batches_per_sec"] / model["steps_per_sec"])
    verdict = [line for line in result.stdout.splitlines() if line.startswith("verdict: ")]
    assert len(verdict) == 1, result.stdout
    # The verdict's figure is the ratio (or, where the input is short, its inverse) at the precision its branch
    # prints: 1.75x with little headroom, 12.3x with plenty (CI once read "1.7x" into "1.75x" and failed).
    ratio = report["input_to_model_ratio"]
    shown = float(re.search(r"([\d,.]+)x", verdict[0]).group(1).replace(",", ""))
    figure = ratio if verdict[0].startswith("verdict: the input pipeline delivers") else 1 / ratio
    assert shown == pytest.approx(figure, abs=0.051), (verdict, ratio)
    assert any(line.startswith("  measured: the input pipeline alone (no model): 15 batches in ")
               for line in result.stdout.splitlines()), result.stdout
    assert nomodel.returncode == 0, nomodel.stderr[-3000:]
    assert "verdict:" not in nomodel.stdout and json.load(open(nomodel_out))["model"] is None
