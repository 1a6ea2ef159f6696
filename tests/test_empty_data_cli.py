"""`tpu-pipeline train` on empty data, a stalled input and the smallest smoke test, as real child processes.

Each empty-data case ends before the first step with one line naming the key and the fix (no trace); a
training input that yields nothing (one-token documents, which `lm_shift` leaves empty, packed into no
row) ends the run with a line naming the stage it is stuck at, and a SIGTERM then ends it at once; and
`train.epochs=1` on the image demo runs, its one-epoch warm-up shrunk with a line.

Slow (each child imports TensorFlow): `pytest -m "not slow"` skips them locally; CI runs them.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest
import tensorflow as tf
import yaml

from helpers import run_together
from tpu_pipeline.records import ensure_demo_dataset

pytestmark = [pytest.mark.tf_builds, pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TRAIN = [sys.executable, "-m", "tpu_pipeline.cli", "train"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def small_demo(tmp_path_factory) -> str:
    return ensure_demo_dataset(str(tmp_path_factory.mktemp("small")), num_train=512, num_eval=128, size=32, num_shards=4)


@pytest.fixture(scope="module")
def small_config(small_demo, tmp_path_factory) -> str:
    """configs/demo.yaml on the small set, as a file of its own: its sources read `dir` (what an override switches)."""
    raw = yaml.safe_load(open(os.path.join(REPO, "configs", "demo.yaml")))
    for section in ("data", "eval_data"):
        raw[section]["source"]["dir"] = small_demo
        raw[section]["preprocess"][1]["size"] = 32
        raw[section]["batch_size"] = 64
    raw["train"]["tensorboard"] = False
    path = str(tmp_path_factory.mktemp("config") / "demo_small.yaml")
    yaml.safe_dump(raw, open(path, "w"))
    return path


def with_empty_validation(data_dir: str, out: str) -> str:
    """A copy of a converted dataset whose validation split lists no record (its shards empty)."""
    os.makedirs(out)
    metadata = json.load(open(os.path.join(data_dir, "metadata.json")))
    for name in os.listdir(data_dir):
        if name.startswith("train-"):
            tf.io.gfile.copy(os.path.join(data_dir, name), os.path.join(out, name))
    for name in metadata["splits"]["validation"]["files"]:
        open(os.path.join(out, name), "wb").close()
    metadata["splits"]["validation"].update(counts=[0] * len(metadata["splits"]["validation"]["files"]), num_examples=0)
    json.dump(metadata, open(os.path.join(out, "metadata.json"), "w"))
    return out


def error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert not any(line.startswith(("training ", "step ", "epoch ")) for line in result.stdout.splitlines()), result.stdout
    lines = [line for line in result.stderr.splitlines() if line.startswith("tpu-pipeline train: error: ")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0].removeprefix("tpu-pipeline train: error: ")


def test_empty_data_is_one_line_before_the_first_step_and_a_one_epoch_smoke_test_runs(small_demo, small_config,
                                                                                       tmp_path):
    empty = str(tmp_path / "empty.tfrecord")
    open(empty, "wb").close()  # 0 bytes, as a copy cut short leaves it
    no_validation = with_empty_validation(small_demo, str(tmp_path / "no_validation"))
    mixture = ("data.mixture={sources: [{name: shapes, weight: 1, source: {dir: %s}}, "
               "{name: extra, weight: 1, source: {files: %s}}]}" % (small_demo, empty))
    cases = {
        # Switching the demo's `dir` to `files` is one override (its dir and split are dropped).
        "empty file": [f"data.source.files={empty}"],
        "empty list": ["data.source.files=[]"],
        "empty split": [f"eval_data.source.dir={no_validation}"],
        "mixture": ["data.source=null", "data.cache.enabled=false", mixture],
        "smoke test": ["train.epochs=1"],
    }
    results = dict(zip(cases, run_together(
        [TRAIN + ["--config", small_config, f"train.run_dir={tmp_path / name.replace(' ', '_')}"] + args
         for name, args in cases.items()],
        timeout=600, cwd=REPO, env=ENV)))

    assert error_line(results["empty file"]) == (
        f"data.source.files={empty}: the file it matches holds no record ({empty}: 0 bytes), so there is nothing to "
        "read; point data.source.files at TFRecord files that hold records, or write it again")
    assert error_line(results["empty list"]) == (
        "data.source.files is empty ([]): there is nothing to read; give a glob of TFRecord files, e.g. "
        "data.source.files=gs://bucket/train-*.tfrecord, or a converted dataset with data.source.dir=DIR")
    assert error_line(results["empty split"]) == (
        f"eval_data.source.split=validation: {no_validation}'s metadata.json lists no record in split 'validation' "
        "(its splits: train 512, validation 0), so there is nothing to read; choose a split that holds records "
        "(eval_data.source.split=train), or convert the data again")
    assert error_line(results["mixture"]) == (
        f"data.mixture.sources[1] (extra): data.mixture.sources.1.source.files={empty}: the file it matches holds no "
        f"record ({empty}: 0 bytes), so there is nothing to read; point data.mixture.sources.1.source.files at TFRecord "
        "files that hold records, or write it again, or remove this source from data.mixture.sources")

    smoke = results["smoke test"]
    assert smoke.returncode == 0, smoke.stdout[-2000:] + smoke.stderr[-3000:]
    lines = smoke.stdout.splitlines()
    note = ("model.schedule.warmup_epochs=1 (8 steps) covers the whole 1-epoch run (8 steps): warming up over its "
            "first 4 steps (half the run) instead; set model.schedule.warmup_epochs below 1 to choose")
    assert note in lines and lines.index(note) < next(i for i, line in enumerate(lines) if line.startswith("training "))
    assert json.load(open(tmp_path / "smoke_test" / "metrics.json"))["steps"] == 8


def one_token_corpus(tmp_path) -> str:
    """A language-model config over documents of one token each: `lm_shift` leaves every one empty, so
    packing makes no row, epoch after epoch (the files hold records: no start-up check can tell)."""
    path = str(tmp_path / "one_token.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for index in range(64):
            feature = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=[3 + index % 200]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    config = {
        "data": {"source": {"type": "tfrecord", "files": path}, "features": {"tokens": {"dtype": "int64", "kind": "ragged"}},
                 "preprocess": [{"op": "lm_shift", "key": "tokens"}],
                 "sequence": {"keys": ["inputs", "targets"], "length": 16, "mode": "pack"},
                 "repeat": "forever", "batch_size": 4},
        "model": {"architecture": "transformer",
                  "transformer": {"width": 16, "depth": 1, "heads": 2, "mlp_dim": 32, "vocab_size": 260},
                  "schedule": {"name": "constant", "learning_rate": 0.001}},
        "train": {"task": "language_model", "epochs": 2, "steps_per_epoch": 5, "tensorboard": False},
    }
    config_path = str(tmp_path / "one_token.yaml")
    yaml.safe_dump(config, open(config_path, "w"))
    return config_path


def test_a_stalled_input_ends_the_run_naming_the_stage_and_sigterm_ends_it_at_once(tmp_path):
    config = one_token_corpus(tmp_path)
    stalled = subprocess.Popen(TRAIN + ["--config", config, f"train.run_dir={tmp_path / 'stalled'}",
                                        "train.input_stall_seconds=2"],
                               cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The default stall time (minutes): only the SIGTERM can end this one.
    stopped = subprocess.Popen(TRAIN + ["--config", config, f"train.run_dir={tmp_path / 'stopped'}"],
                               cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        before = []
        for line in stopped.stdout:
            before.append(line)
            if line.startswith("training "):
                break
        assert stopped.poll() is None, "".join(before)
        stopped.send_signal(signal.SIGTERM)  # the input already waits, or soon will: the watch sees both
        out, err = stopped.communicate(timeout=300)
        stall_out, stall_err = stalled.communicate(timeout=300)
    finally:
        for child in (stalled, stopped):
            if child.poll() is None:
                child.kill()
                child.communicate()

    assert stopped.returncode == 143, "".join(before) + out + err[-3000:]
    assert re.fullmatch(  # and nothing else after "training ...": no step, no evaluation
        r"stopped by SIGTERM while the training input had delivered no batch for \d+ s, so no step could end to save "
        r"at; no checkpoint was saved yet: the same command starts the run again from step 0", out.strip()), out

    result = subprocess.CompletedProcess(stalled.args, stalled.returncode, stall_out, stall_err)
    assert any(line.startswith("training 2 epoch(s)") for line in stall_out.splitlines()), stall_out
    result.stdout = ""  # the error comes after "training ...": the run had started
    line = error_line(result)
    assert re.fullmatch(
        r"data: the training input delivered no batch for \d+ s \(train.input_stall_seconds=2; 0 batch\(es\) before in "
        r"this process\), stuck at data.sequence \(mode pack\): its input yields elements, it yields none in 10 s "
        r"\(every example may hold no token once the ops ran, e.g. documents of one token after lm_shift, .*\); no "
        r"checkpoint was saved yet: the same command starts the run again from step 0; if the pipeline is only slow "
        r"to start, raise train.input_stall_seconds", line), line
