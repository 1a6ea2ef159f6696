"""Real kills of real child processes, then a restart of the same command: every epoch is still the
dataset exactly (no repeat, no gap), and steps redone after a kill see the same examples.

Slow (each child imports TensorFlow): `pytest -m "not slow"` skips them locally; CI runs them.
"""
from __future__ import annotations

import collections
import glob
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from helpers import write_jpeg_shards, write_small_shards

pytestmark = [pytest.mark.tf_builds, pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CHILD = os.path.join(HERE, "preemption_child.py")
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([REPO, HERE])}


def read_log(out_dir: str) -> dict[tuple[int, int], list[int]]:
    """(step, part) → ids; a step redone after a kill must have logged the same ids each time."""
    seen: dict[tuple[int, int], list[int]] = {}
    paths = sorted(glob.glob(os.path.join(out_dir, "ids*.log")))  # one per process (IDS_LOG)
    for line in (line for path in paths for line in open(path).read().splitlines()):
        fields = line.split()
        if len(fields) < 3:
            continue  # a line cut short by the kill
        key, ids = (int(fields[0]), int(fields[1])), [int(i) for i in fields[2:]]
        if key in seen and seen[key] != ids and len(ids) == len(seen[key]):
            raise AssertionError(f"step {key[0]} part {key[1]} was redone with other ids: {seen[key]} then {ids}")
        seen[key] = ids
    return seen


def max_step(out_dir: str) -> int:
    return max((step for step, _ in read_log(out_dir)), default=-1)


def interrupt(command: list[str], out_dir: str, at_step: int, how: int, timeout: float = 240,
              env: dict | None = None) -> subprocess.CompletedProcess:
    """Starts `command`, sends `how` once it has logged step `at_step`; returns what it printed."""
    child = subprocess.Popen(command, cwd=REPO, env=env or ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout
    while child.poll() is None and max_step(out_dir) < at_step:
        assert time.monotonic() < deadline, "the child made no progress"
        time.sleep(0.05)
    if child.poll() is None:
        child.send_signal(how)
    output, _ = child.communicate(timeout=120)
    return subprocess.CompletedProcess(command, child.returncode, output)


def epochs_of(stream: list[int], length: int) -> list[list[int]]:
    return [stream[e * length:(e + 1) * length] for e in range(len(stream) // length)]


def assert_exact_epochs(streams: list[list[int]], length: int, num: int) -> None:
    """Each input pipeline's epoch e is `length` distinct ids; together, disjoint and within the data."""
    for epoch in range(min(len(s) for s in streams) // length):
        parts = [stream[epoch * length:(epoch + 1) * length] for stream in streams]
        union = [i for part in parts for i in part]
        counts = collections.Counter(union)
        repeated = sorted(i for i, c in counts.items() if c > 1)
        assert not repeated, f"epoch {epoch}: ids delivered twice: {repeated[:10]}"
        assert len(union) == length * len(streams) and set(union) <= set(range(num)), f"epoch {epoch}: gap or unknown id"


def loop_config(parse: str, files: str, records: bool) -> dict:
    if parse == "per_example":
        features = {"image": {"dtype": "string"}, "id": {"dtype": "int64"}}
        ops = [{"op": "decode_and_random_crop_jpeg", "size": 4}]
    else:
        features = {"features": {"dtype": "float32", "shape": [16]}, "id": {"dtype": "int64"}}
        ops = [{"op": "cast", "key": "id", "dtype": "int32"}]
    return {"data": {"source": {"type": "tfrecord", "files": files}, "features": features, "augment": ops,
                     "batch_size": 16 if parse == "per_example" else 64, "shuffle": {"buffer_size": 64},
                     "cache": {"records": records}, "repeat": "forever"}}


@pytest.mark.parametrize("records", [False, True], ids=["no_record_cache", "record_cache"])
@pytest.mark.parametrize("parse", ["per_example", "batched"])
def test_two_input_pipelines_killed_five_times_deliver_every_epoch_exactly(tmp_path, parse, records):
    num = 98 if parse == "per_example" else 700  # 98 // 2 = 49 a pipeline: epochs end mid-batch
    files = write_jpeg_shards(tmp_path / "data", num, 5, size=8) if parse == "per_example" \
        else write_small_shards(tmp_path / "data", num, 3)[0]
    config_path, out_dir = str(tmp_path / "config.json"), str(tmp_path / "out")
    os.makedirs(out_dir)
    json.dump(loop_config(parse, files, records), open(config_path, "w"))
    per_step = 8 if parse == "per_example" else 32  # a pipeline's batch (global 16 or 64 over 2 replicas)
    length = num // 2
    steps = -(-3 * length // per_step)  # three epochs
    command = [sys.executable, CHILD, "loop", config_path, out_dir, str(steps)]
    rng = random.Random(f"{parse}-{records}")
    restored = 0
    for kill in range(5):
        target = max_step(out_dir) + rng.randint(1, 4)
        saved = os.path.exists(os.path.join(out_dir, "checkpoints", "checkpoint"))
        result = interrupt(command, out_dir, target, signal.SIGKILL)
        assert result.returncode == -signal.SIGKILL, f"kill {kill}: the child ended by itself:\n{result.stdout[-2000:]}"
        assert ("restored step" in result.stdout) == saved, result.stdout[-2000:]
        restored += saved
    assert restored >= 3, "too few kills came after a checkpoint to test a resume"
    final = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0 and "done" in final.stdout, final.stdout[-2000:] + final.stderr[-3000:]

    log = read_log(out_dir)
    assert sorted({step for step, _ in log}) == list(range(steps))
    streams = [[i for step in range(steps) for i in log[(step, part)]] for part in range(2)]
    assert_exact_epochs(streams, length, num)


def train_config(data_dir: str, run_dir: str) -> dict:
    return {
        "data": {
            "source": {"type": "tfrecord", "dir": data_dir, "split": "train"},
            "features": {"image": {"dtype": "string"}, "id": {"dtype": "int64"}},
            "preprocess": [{"op": "decode_image", "format": "jpeg"}, {"op": "resize", "size": 16},
                           {"op": "value_range", "min": 0.0, "max": 1.0}, {"op": "cast", "key": "id", "dtype": "int32"}],
            "augment": [{"op": "random_flip"}],
            "shuffle": {"buffer_size": 256},
            "batch_size": 64,
            "outputs": {"inputs": "image", "targets": "id"},  # the ids are the labels: train_step sees them
        },
        "cluster": {"cpu_replicas": 8},
        "model": {"architecture": "mlp", "mlp": {"hidden_units": [8]}},
        "train": {"run_dir": run_dir, "epochs": 4, "checkpoint_every_steps": 2, "num_classes": 512,
                  "log_every_steps": 4, "tensorboard": False, "max_checkpoints": 2},
    }


def test_train_on_eight_replicas_killed_five_times_and_terminated_once_resumes_exactly_on_four_at_half_the_batch(
        tmp_path):
    from tpu_pipeline.records.demo_shapes import ensure_demo_dataset

    data_dir = ensure_demo_dataset(str(tmp_path / "data"), num_train=512, num_eval=64, size=16, num_shards=8)
    run_dir, out_dir = str(tmp_path / "run"), str(tmp_path / "out")
    os.makedirs(out_dir)
    config_path = str(tmp_path / "config.json")
    json.dump(train_config(data_dir, run_dir), open(config_path, "w"))
    command = [sys.executable, CHILD, "train", config_path, out_dir]
    length = 512
    rng = random.Random(7)
    for kill in range(5):
        target = max_step(out_dir) + rng.randint(1, 3)
        result = interrupt(command, out_dir, target, signal.SIGKILL)
        assert result.returncode == -signal.SIGKILL, f"kill {kill}:\n{result.stdout[-3000:]}"
        assert not os.path.exists(os.path.join(run_dir, "metrics.json"))
    # SIGTERM, as a preempted Cloud TPU VM or Kubernetes sends: a checkpoint at the next step, then exit 143.
    result = interrupt(command, out_dir, max_step(out_dir) + 1, signal.SIGTERM)
    assert result.returncode == 143, result.stdout[-3000:]
    stopped = [line for line in result.stdout.splitlines() if line.startswith("stopped by SIGTERM at step")]
    assert stopped, result.stdout[-3000:]
    sigterm_step = int(stopped[0].split()[5])
    assert os.path.exists(os.path.join(run_dir, "checkpoints", f"ckpt-{sigterm_step}.index"))

    # The rest on 4 replicas (a smaller slice of one host) with half the global batch, as a user keeping each
    # replica's: the run goes on by examples trained (step x 2), from the same example (issue 51, item 2).
    four = str(tmp_path / "four.json")
    config = train_config(data_dir, run_dir)
    config["data"]["batch_size"] = 32
    json.dump({**config, "cluster": {"cpu_replicas": 4}, "train": {**config["train"], "allow_changes": ["data.batch_size"]}},
              open(four, "w"))
    final = subprocess.run([sys.executable, CHILD, "train", four, out_dir], cwd=REPO, env=ENV, capture_output=True,
                           text=True, timeout=300)
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    assert "4 replicas on 1 host" in final.stdout, final.stdout[-3000:]
    rebased, steps = 2 * sigterm_step, 4 * (512 // 32)
    assert (f"data.batch_size 64 -> 32: the run goes on by examples trained, {64 * sigterm_step:,}: step {sigterm_step} "
            f"-> {rebased}") in final.stdout, final.stdout[-3000:]
    assert f"resumed from {os.path.join(run_dir, 'checkpoints', f'ckpt-{sigterm_step}')}: step {rebased}" in final.stdout
    assert f"continue from example {64 * sigterm_step:,} of the training stream" in final.stdout
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert metrics["resumed_from_step"] == rebased and metrics["steps"] == steps
    assert metrics["history"]["epoch"] == [1, 2, 3, 4], metrics["history"]  # every epoch, across 7 processes

    log = read_log(out_dir)
    assert sorted({step for step, _ in log}) == list(range(sigterm_step)) + list(range(rebased, steps))
    assert all(len(log[(step, replica)]) == 8 for step in range(rebased, steps) for replica in range(4))
    stream = [i for step in sorted({step for step, _ in log}) for replica in range(8) for i in log.get((step, replica), [])]
    assert_exact_epochs([stream], length, 512)

    again = subprocess.run([sys.executable, CHILD, "train", four, out_dir], cwd=REPO, env=ENV, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0 and "run already complete" in again.stdout
    assert "could not be found" not in again.stdout + again.stderr


def augmented_config(data_dir: str, run_dir: str) -> dict:
    """train_config with the DeiT ops: RandAugment, random erasing, and mixup / CutMix on each replica's batch
    (the targets are soft: the log holds a digest of each replica's images and targets)."""
    config = train_config(data_dir, run_dir)
    config["data"].update({
        "features": {"image": {"dtype": "string"}, "label": {"dtype": "int64"}},
        "preprocess": [{"op": "decode_image", "format": "jpeg"}, {"op": "resize", "size": 16},
                       {"op": "cast", "key": "label", "dtype": "int32"}],
        "augment": [{"op": "random_flip"}, {"op": "randaugment", "num_layers": 2, "magnitude": 9},
                    {"op": "value_range", "min": 0.0, "max": 1.0}, {"op": "random_erasing", "probability": 0.5},
                    {"op": "mixup_cutmix", "num_classes": 4}],
        "outputs": {"inputs": "image", "targets": "label"},
    })
    config["train"].update({"epochs": 2, "num_classes": 4})
    return config


def test_train_with_randaugment_and_mixup_killed_twice_trains_on_the_batches_of_an_uninterrupted_run(tmp_path):
    """Exact resume with augmentation on: after two SIGKILLs, every step of every replica trained on the very
    images and soft targets (a SHA-256 of each replica's batch) an uninterrupted run trains on."""
    from tpu_pipeline.records.demo_shapes import ensure_demo_dataset

    data_dir = ensure_demo_dataset(str(tmp_path / "data"), num_train=256, num_eval=32, size=16, num_shards=4)
    logs = {}
    for name, kills in (("killed", 2), ("uninterrupted", 0)):
        out_dir = str(tmp_path / name)
        os.makedirs(out_dir)
        config_path = str(tmp_path / f"{name}.json")
        json.dump(augmented_config(data_dir, str(tmp_path / f"{name}_run")), open(config_path, "w"))
        command = [sys.executable, CHILD, "train_digest", config_path, out_dir]
        rng = random.Random(3)
        for kill in range(kills):
            result = interrupt(command, out_dir, max_step(out_dir) + rng.randint(2, 4), signal.SIGKILL)
            assert result.returncode == -signal.SIGKILL, f"kill {kill}:\n{result.stdout[-3000:]}"
        final = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
        assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
        assert ("resumed from" in final.stdout) == bool(kills), final.stdout[-3000:]
        logs[name] = read_log(out_dir)  # also: a step redone after a kill saw the same batch
    steps = 2 * (256 // 64)
    assert sorted(logs["uninterrupted"]) == [(step, replica) for step in range(steps) for replica in range(8)]
    assert logs["killed"] == logs["uninterrupted"]
    assert len({tuple(digest) for digest in logs["uninterrupted"].values()}) == steps * 8


# --- a preemption notice: save, write the metrics so far, exit; never an evaluation in between -----


def read_events(out_dir: str) -> list[str]:
    path = os.path.join(out_dir, "events.log")
    return open(path).read().splitlines() if os.path.exists(path) else []


def evaluating_config(data_dir: str, run_dir: str) -> dict:
    """One replica, 8 steps an epoch, and a validation of 8 steps at each epoch's end."""
    config = train_config(data_dir, run_dir)
    config["data"]["batch_size"] = 32
    config["eval_data"] = {**config["data"], "source": {"type": "tfrecord", "dir": data_dir, "split": "validation"},
                           "augment": [], "batch_size": 8}
    config["cluster"] = {"cpu_replicas": 1}
    config["train"].update(epochs=3, checkpoint_every_steps=None, checkpoint_every_seconds=None, max_checkpoints=3)
    return config


def after_the_notice(events: list[str], signalled: str) -> list[str]:
    """What the child did from the SIGTERM on: the training step in flight may finish, then nothing but
    the save, the metrics and the exit, in that order."""
    assert events.count("sigterm") == 1, events[-20:]
    after = events[events.index("sigterm") + 1:]
    assert not [e for e in after if e.startswith("eval")], f"{signalled}: an evaluation after the notice: {after}"
    done = [e for e in after if not e.startswith("train")]
    assert [e.split()[0] for e in done] == ["save", "metrics", "exit"], f"{signalled}: {after}"
    assert done[2] == "exit 143" and done[0].split()[1] == done[1].split()[1], after
    assert all(e.startswith("train") for e in after[:after.index(done[0])]), after
    return done


@pytest.fixture(scope="module")
def evaluated_demo(tmp_path_factory) -> str:
    from tpu_pipeline.records.demo_shapes import ensure_demo_dataset

    return ensure_demo_dataset(str(tmp_path_factory.mktemp("evaluated")), num_train=256, num_eval=64, size=16,
                               num_shards=4)


def evaluating_child(data_dir: str, tmp_path) -> tuple[str, str, list[str]]:
    """(run_dir, out_dir, the child's command) for a run that validates every epoch."""
    run_dir, out_dir = str(tmp_path / "run"), str(tmp_path / "out")
    os.makedirs(out_dir)
    config_path = str(tmp_path / "config.json")
    json.dump(evaluating_config(data_dir, run_dir), open(config_path, "w"))
    return run_dir, out_dir, [sys.executable, CHILD, "train", config_path, out_dir]


def test_sigterm_mid_epoch_saves_writes_the_metrics_so_far_and_exits_without_evaluating(evaluated_demo, tmp_path):
    run_dir, out_dir, command = evaluating_child(evaluated_demo, tmp_path)
    result = interrupt(command, out_dir, 8 + 3, signal.SIGTERM)  # into epoch 2, after epoch 1's validation
    assert result.returncode == 143, result.stdout[-3000:]
    events = read_events(out_dir)
    assert any(e.startswith("eval") for e in events[:events.index("sigterm")]), "epoch 1 was not validated"
    save, metrics_event, _ = after_the_notice(events, "mid-epoch")
    step = int(save.split()[1])
    stopped = [line for line in result.stdout.splitlines() if line.startswith("stopped by SIGTERM")]
    assert stopped == [f"stopped by SIGTERM at step {step} of 24; the checkpoint is saved and the metrics so far "
                       f"are in {run_dir}/metrics.json (no evaluation): start the same command again to resume"], \
        result.stdout[-3000:]
    assert not [line for line in result.stdout.splitlines() if line.startswith(f"epoch 2/3")], result.stdout[-3000:]
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert metrics["stopped_by_sigterm_at_step"] == step == metrics["steps"] and "eval_loss" not in metrics
    assert metrics["history"]["epoch"] == [1] and len(metrics["history"]["val_loss"]) == 1
    assert os.path.exists(os.path.join(run_dir, "checkpoints", f"ckpt-{step}.index"))


def test_sigterm_during_a_validation_ends_it_and_the_epoch_counts_as_trained(evaluated_demo, tmp_path):
    run_dir, out_dir, command = evaluating_child(evaluated_demo, tmp_path)
    env = {**ENV, "EVAL_STEP_SECONDS": "0.3"}  # a validation of 8 steps takes 2.4 s at least
    child = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while child.poll() is None and not any(e.startswith("eval") for e in read_events(out_dir)):
        assert time.monotonic() < deadline, "the child never validated"
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    output, _ = child.communicate(timeout=120)
    assert child.returncode == 143, output[-3000:]
    events = read_events(out_dir)
    evaluated = [e for e in events if e.startswith("eval")]
    assert len(evaluated) < 8, f"the whole validation ran: {evaluated}"
    save, _, _ = after_the_notice(events, "during validation")
    assert save == "save 8", events[-20:]  # epoch 1's end: its training is done
    assert "saved checkpoint" in output and "at step 8 (epoch 1, SIGTERM)" in output, output[-3000:]
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert metrics["stopped_by_sigterm_at_step"] == 8 and metrics["history"]["epoch"] == [1], metrics
    assert "val_loss" not in metrics["history"], metrics["history"]  # its validation never finished

    final = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    assert "step 8 (epoch 2, step 0 of 8)" in final.stdout, final.stdout[-3000:]
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert "stopped_by_sigterm_at_step" not in metrics and metrics["steps"] == 24 and "eval_loss" in metrics
    assert metrics["history"]["epoch"] == [1, 2, 3] and len(metrics["history"]["val_loss"]) == 2, metrics["history"]
