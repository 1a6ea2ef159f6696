"""A run directory knows what it was started with: a resume on other data, another sequence shape,
global batch, model or task is refused in one line naming the keys and the two ways on; free
settings (more epochs, logging, a mixture's weights) pass; `train.allow_changes` continues a run with a
change, which then sticks. The `train` runs are real `tpu-pipeline train` child processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tpu_pipeline.config import config_from_dict, load_config
from tpu_pipeline.config.identity import differences, run_identity
from tpu_pipeline.errors import ConfigError

pytestmark = pytest.mark.tf_independent

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_CONFIG = os.path.join(REPO, "configs", "demo.yaml")
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


# --- which keys are compared (no TensorFlow) -----------------------------------------------------


def demo(*overrides: str):
    return load_config(DEMO_CONFIG, ["data.source.dir=/data/shapes", "eval_data.source.dir=/data/shapes", *overrides])


def changed(a, b) -> list[str]:
    return [key for key, _, _ in differences(run_identity(a), run_identity(b))]


def test_data_sequence_batch_model_and_task_are_compared_and_the_rest_is_free():
    base = demo()
    assert changed(base, demo("data.source.split=validation")) == ["data.source.split"]
    assert changed(base, demo("data.source.dir=/data/other")) == ["data.source.dir"]
    assert changed(base, demo("data.batch_size=64")) == ["data.batch_size"]
    assert changed(base, demo("model.cnn.filters=[8, 16]")) == ["model.cnn.filters"]
    assert changed(base, demo("model.optimizer.name=sgd")) == ["model.optimizer.name"]
    assert changed(base, demo("model.architecture=mlp")) == [
        "model.architecture", "model.cnn.filters", "model.mlp.hidden_units"]
    assert changed(base, demo("train.num_classes=5")) == ["train.num_classes"]
    free = ["train.epochs=30", "train.log_every_steps=1", "train.checkpoint_every_steps=5", "train.steps_per_epoch=3",
            "train.tensorboard=false", "model.schedule.learning_rate=0.5", "model.cnn.dropout=0.2",
            "model.precision=float32", "cluster.cpu_replicas=8", "eval_data.source.split=train", "data.seed=3",
            "data.shuffle.buffer_size=7", "data.num_parallel_calls=2", "eval_data.batch_size=8"]
    assert changed(base, demo(*free)) == []
    # The split a converted dir reads by default is `train`: saying it changes nothing.
    assert changed(base, demo("data.source.split=train")) == []
    # A relative path names the same files as the absolute one it stands for.
    here = load_config(DEMO_CONFIG, ["data.source.dir=data/shapes"])
    there = load_config(DEMO_CONFIG, [f"data.source.dir={os.path.abspath('data/shapes')}"])
    assert changed(here, there) == []


def sequences(**sequence) -> object:
    return config_from_dict({
        "data": {"source": {"type": "tfrecord", "dir": "/data/text"}, "batch_size": 8,
                 "sequence": {"keys": ["inputs", "targets"], "length": 128, **sequence}},
        "model": {"architecture": "transformer"}, "train": {"task": "language_model"},
    })


def test_the_sequence_shape_is_compared_and_its_packing_knobs_are_not():
    base = sequences()
    assert changed(base, sequences(length=256)) == ["data.sequence.length"]
    assert changed(base, sequences(mode="pad")) == ["data.sequence.mode"]
    assert changed(base, sequences(window=64, algorithm="best_fit_decreasing")) == []


def transformer(**section) -> object:
    return config_from_dict({
        "data": {"source": {"type": "tfrecord", "dir": "/data/text"}, "batch_size": 8,
                 "sequence": {"keys": ["inputs", "targets"], "length": 128}},
        "model": {"architecture": "transformer", "transformer": section},
        "train": {"task": "language_model", "num_classes": 256},
    })


# Every weight-shaping key of each built-in architecture, with a value other than its default.
SHAPE_CHANGES = [
    ("mlp", "hidden_units", [128]),
    ("cnn", "filters", [8, 16]),
    ("resnet", "blocks_per_stage", [1, 1]), ("resnet", "width", 32), ("resnet", "block", "bottleneck"),
    ("resnet", "stem", "imagenet"),
    ("transformer", "width", 128), ("transformer", "depth", 2), ("transformer", "heads", 8),
    ("transformer", "mlp_dim", 512), ("transformer", "tie_embeddings", True), ("transformer", "vocab_size", 256),
    ("transformer", "max_length", 256), ("transformer", "tokens_key", "inputs"), ("transformer", "causal", False),
    ("transformer", "pooling", "first"),
]


@pytest.mark.parametrize("architecture, key, value", SHAPE_CHANGES, ids=[f"{a}.{k}" for a, k, _ in SHAPE_CHANGES])
def test_every_shape_key_of_the_model_is_compared(architecture: str, key: str, value: object) -> None:
    """A run dir resumed with another model shape (width, depth, layers, vocab...) is refused: its checkpoint
    holds weights of the first shape, so each architecture's shape keys must all be in the identity."""
    if architecture == "transformer":
        base, other = transformer(), transformer(**{key: value})
    else:
        base = demo(f"model.architecture={architecture}")
        other = demo(f"model.architecture={architecture}", f"model.{architecture}.{key}={json.dumps(value)}")
    assert changed(base, other) == [f"model.{architecture}.{key}"]


def mixture(**weights: float):
    sources = [{"name": name, "weight": weights.get(name, 1.0), "source": {"dir": f"/data/{name}"}}
               for name in ("web", "code")]
    return config_from_dict({"data": {"mixture": {"sources": sources}, "features": {"tokens": {"dtype": "int64"}},
                                      "batch_size": 8, "repeat": "forever"}})


def test_a_mixtures_weights_are_free_and_its_sources_are_not():
    assert changed(mixture(), mixture(web=0.1, code=3.0)) == []
    moved = mixture()
    moved.data.mixture.sources[1].source.dir = "/data/code2"
    assert changed(mixture(), moved) == ["data.mixture.sources"]
    assert {"data.mixture.sources", "data.source.type", "data.source.dir"} <= set(changed(mixture(), demo()))


def test_allow_changes_takes_compared_keys_or_their_sections_only():
    assert demo("train.allow_changes=[data, model.cnn.filters]").train.allow_changes == ["data", "model.cnn.filters"]
    with pytest.raises(ConfigError, match=r"train.allow_changes: 'data.seed' is not a key a resume compares; .*data.source"):
        demo("train.allow_changes=[data.seed]")


def test_no_stream_is_refused_on_another_number_of_hosts(monkeypatch):
    """Every stream goes on: an example stream's rest is dealt (tests/test_remainder.py, tests/test_multiworker.py),
    a mixture's too (tests/test_mixture_on_another_slice.py), a packed one deals its rows
    (tests/test_pack_on_another_slice.py), a bucketed one regroups, scaled by tokens or not
    (tests/test_bucket_on_another_slice.py)."""
    from tpu_pipeline.train import started_with

    packed = load_config(os.path.join(REPO, "configs", "text_lm.yaml"), ["train.run_dir=/runs/r"])
    saved = started_with.record(packed, input_pipelines=2)
    monkeypatch.setattr(started_with, "saved_record", lambda path: saved)
    started_with.check_hosts(packed, "/runs/r/checkpoints/ckpt-5", 2)
    started_with.check_hosts(packed, "/runs/r/checkpoints/ckpt-5", 1)  # pack: the rows its hosts had left are dealt
    started_with.check_hosts(mixture(), "c", 4)  # an example stream's rest: dealt (`ExampleLayout`)
    # Through data.service a resume starts a fresh job at an epoch whatever the hosts; older records hold no count;
    # no checkpoint, nothing to compare.
    started_with.check_hosts(load_config(os.path.join(REPO, "configs", "text_lm.yaml"), [
        "train.run_dir=/runs/r", "data.service.address=localhost:5050"]), "c", 1)
    monkeypatch.setattr(started_with, "saved_record", lambda path: {"identity": saved["identity"]})
    started_with.check_hosts(packed, "c", 1)
    started_with.check_hosts(packed, None, 1)
    # bucket mode: every host reads the whole stream, so its places regroup (tests/test_bucket_on_another_slice.py);
    # scaled by tokens its groups change with the slice: the examples they held are skipped
    bucketed = load_config(os.path.join(REPO, "configs", "text_lm.yaml"), [
        "train.run_dir=/runs/r", "data.sequence.mode=bucket", "eval_data.sequence.mode=bucket"])
    monkeypatch.setattr(started_with, "saved_record", lambda path: started_with.record(bucketed, input_pipelines=2))
    started_with.check_hosts(bucketed, "c", 1)
    by_tokens = load_config(os.path.join(REPO, "configs", "text_lm.yaml"), [
        "train.run_dir=/runs/r", "data.sequence.mode=bucket", "eval_data.sequence.mode=bucket",
        "data.sequence.bucket_batch=tokens"])
    started_with.check_hosts(by_tokens, "c", 1)


# --- real runs ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> str:
    from tpu_pipeline.records import ensure_demo_dataset

    return ensure_demo_dataset(str(tmp_path_factory.mktemp("shapes")), num_train=256, num_eval=64, size=16, num_shards=4)


def train(data_dir: str, run_dir: str, *extra: str) -> subprocess.CompletedProcess:
    args = [f"data.source.dir={data_dir}", f"eval_data.source.dir={data_dir}", "data.preprocess.1.size=16",
            "eval_data.preprocess.1.size=16", "data.batch_size=32", "eval_data.batch_size=32",
            "train.steps_per_epoch=2", "train.tensorboard=false", "model.cnn.filters=[8]",
            f"train.run_dir={run_dir}", *extra]
    return subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", "train", "--config", DEMO_CONFIG, *args],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)


def on_disk(run_dir: str) -> dict[str, float]:
    return {name: os.path.getmtime(os.path.join(run_dir, "checkpoints", name))
            for name in os.listdir(os.path.join(run_dir, "checkpoints"))} | {
        "metrics.json": os.path.getmtime(os.path.join(run_dir, "metrics.json"))}


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_a_run_resumes_only_what_it_was_started_with(shapes, tmp_path):
    run_dir = str(tmp_path / "run")
    ok(train(shapes, run_dir, "train.epochs=2"))
    before = on_disk(run_dir)

    # The case: the validation split and one more epoch. Refused in one line, nothing touched.
    other = train(shapes, run_dir, "data.source.split=validation", "train.epochs=3")
    assert other.returncode == 2, other.stdout[-3000:] + other.stderr[-3000:]
    errors = [line for line in other.stderr.splitlines() if line.startswith("tpu-pipeline train: error:")]
    assert errors == [
        f"tpu-pipeline train: error: train.run_dir={run_dir} holds a run started with other settings: "
        f"data.source.split 'train' -> 'validation' (checkpoint {run_dir}/checkpoints/ckpt-4); start a new run with "
        "another train.run_dir, or continue this one with the change, e.g. to fine-tune, with "
        "train.allow_changes=[data.source.split]"], other.stderr[-3000:]
    assert "Traceback" not in other.stderr and not any(line.startswith(("training ", "step ")) for line in other.stdout.splitlines())
    # Another model and another global batch: each key named.
    model = train(shapes, run_dir, "model.cnn.filters=[16]", "data.batch_size=64", "train.epochs=3")
    assert model.returncode == 2 and "settings: data.batch_size 32 -> 64, model.cnn.filters [8] -> [16] (checkpoint" \
        in model.stderr and "train.allow_changes=[data.batch_size,model.cnn.filters]" in model.stderr, model.stderr[-3000:]
    # Accepted, a model whose weights no longer fit the checkpoint is still refused in one line.
    reshaped = train(shapes, run_dir, "model.cnn.filters=[16]", "train.epochs=3", "train.allow_changes=[model]")
    assert reshaped.returncode == 2 and (f"tpu-pipeline train: error: train.run_dir={run_dir}: {run_dir}/checkpoints/"
                                         "ckpt-4 does not fit this config's model (Received incompatible tensor"
                                         in reshaped.stderr), reshaped.stderr[-3000:]
    assert "Traceback" not in reshaped.stderr
    assert on_disk(run_dir) == before

    # The same data, the same epochs: complete, and the line says what to type to train on.
    again = ok(train(shapes, run_dir, "train.epochs=2", "train.log_every_steps=1"))
    assert (f"run already complete: 2 of 2 epoch(s), step 4 ({run_dir}/checkpoints/ckpt-4); nothing changed. Its metrics: "
            f"{run_dir}/metrics.json. To train on, run it again with train.epochs=3 or more") in again, again[-3000:]
    assert on_disk(run_dir) == before

    # More epochs run, and say what the schedule does.
    more = ok(train(shapes, run_dir, "train.epochs=3"))
    assert "train.epochs=3 (the run was started with 2): the cosine learning-rate schedule is laid out over 3" in more
    assert f"resumed from {run_dir}/checkpoints/ckpt-4: step 4 (epoch 3, step 0 of 2)" in more, more[-3000:]
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert metrics["steps"] == 6 and metrics["history"]["epoch"] == [1, 2, 3], metrics

    # Fine-tuning on the validation split, accepted by name: it trains, and says so.
    tuned = ok(train(shapes, run_dir, "data.source.split=validation", "train.epochs=4",
                     "train.allow_changes=[data.source.split]"))
    assert (f"train.allow_changes: {run_dir} goes on from ckpt-6 with data.source.split 'train' -> 'validation'"
            in tuned), tuned[-3000:]
    assert json.load(open(os.path.join(run_dir, "metrics.json")))["steps"] == 8
    # The accepted change is what the run is now: the validation split resumes without the override,
    # and the training split is the change.
    assert "run already complete: 4 of 4 epoch(s)" in ok(train(shapes, run_dir, "data.source.split=validation",
                                                               "train.epochs=4"))
    back = train(shapes, run_dir, "train.epochs=5")
    assert back.returncode == 2 and "data.source.split 'validation' -> 'train'" in back.stderr, back.stderr[-3000:]


def test_another_global_batch_goes_on_by_examples_and_one_that_splits_a_batch_is_refused_in_one_line():
    """Issue 51 item 2: with data.batch_size changed (train.allow_changes), the step is rebased to the examples
    trained: the input, the epochs and the learning-rate schedule go on from the same example. A step count
    whose examples are no whole number of the new batches cannot, and says which batches can."""
    from tpu_pipeline.train.batch_change import rebased_step

    assert rebased_step(5, 64, 32, "runs/a", "ckpt-5") == 10  # a slice half the size, each chip's batch kept
    assert rebased_step(6, 64, 128, "runs/a", "ckpt-6") == 3
    with pytest.raises(ConfigError) as refused:
        rebased_step(5, 64, 128, "runs/a", "runs/a/checkpoints/ckpt-5")
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith("train.run_dir=runs/a: runs/a/checkpoints/ckpt-5 trained 320 examples (5 steps of 64), "
                           "which is not a whole number of batches of data.batch_size=128")
    assert "(the nearest: 64, 80, 160)" in line and "train on with data.batch_size=64 to a step where 128 does" in line


def test_a_bucketed_stream_with_another_global_batch_is_rebased_and_its_position_told(monkeypatch):
    """A bucketed stream's step is rebased by batch slots, and its position is told the old batch, so its window
    goes on past the examples the old groups held (tests/test_bucket_on_another_slice.py reads it)."""
    import types

    import tensorflow as tf

    from tpu_pipeline.train import batch_change

    bucketed = load_config(os.path.join(REPO, "configs", "text_lm.yaml"), [
        "train.run_dir=runs/b", "data.sequence.mode=bucket", "eval_data.sequence.mode=bucket", "data.batch_size=8"])
    monkeypatch.setattr(batch_change, "saved_record", lambda path: {"identity": {batch_change.BATCH_KEY: 16}})
    model = types.SimpleNamespace(optimizer=types.SimpleNamespace(iterations=tf.Variable(6, dtype=tf.int64)))
    told, lines = [], []
    position = types.SimpleNamespace(rebase=lambda step, rebased, was: told.append((step, rebased, was)))
    assert batch_change.go_on_by_examples("runs/b/checkpoints/ckpt-6", bucketed, model, 12, position, lambda was: 6,
                                          lines.append) == 12
    assert int(model.optimizer.iterations.numpy()) == 12 and told == [(6, 12, 16)]
    assert lines == ["data.batch_size 16 -> 8: the run goes on by examples trained, 96: step 6 -> 12; steps per epoch "
                     "6 -> 12; the input and the learning-rate schedule go on from where they stood"], lines


def test_a_rebased_layout_keeps_every_place_and_the_rest_being_dealt():
    """The saved layout of an example stream is rebased with the step, its places and a remainder still being
    dealt to the hosts kept; a checkpoint from before layouts were saved gets its places from the old batch."""
    import tensorflow as tf

    from tpu_pipeline.pipeline.core.remainder import Layout, Remainder
    from tpu_pipeline.train.example_layout import ExampleLayout

    layout = ExampleLayout.__new__(ExampleLayout)
    dealing = Layout((448, 512), 7, Remainder((700, 640), 512, taken=96))
    layout.saved = tf.Variable(json.dumps(dealing.to_json()))
    layout.rebase(7, 14, 64)
    assert Layout.from_json(json.loads(layout.saved.numpy().decode())) == Layout((448, 512), 14, dealing.remainder)
    layout.saved.assign(json.dumps(Layout((0, 0)).to_json()))  # as saved before the run's first layout
    layout.rebase(5, 10, 64)
    assert Layout.from_json(json.loads(layout.saved.numpy().decode())) == Layout((160, 160), 10)
