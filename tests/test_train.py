"""The training job: 8-replica fit, checkpoints, kill-and-resume, profiler, and the demo's metrics."""
from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Optional

import pytest
import yaml

from tpu_pipeline.cluster import resolve
from tpu_pipeline.config import load_config
from tpu_pipeline.config.cluster import ClusterConfig
from tpu_pipeline.records import ensure_demo_dataset

pytestmark = pytest.mark.tf_builds

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_CONFIG = os.path.join(REPO, "configs", "demo.yaml")


@pytest.fixture(scope="module")
def small_demo(tmp_path_factory) -> str:
    """A small shapes set (32 px) so that training tests take seconds."""
    return ensure_demo_dataset(str(tmp_path_factory.mktemp("small")), num_train=512, num_eval=128, size=32, num_shards=8)


def small_overrides(data_dir: str, run_dir: str) -> list[str]:
    return [
        f"data.source.dir={data_dir}", f"eval_data.source.dir={data_dir}",
        "data.preprocess.1.size=32", "eval_data.preprocess.1.size=32",
        "data.batch_size=64", "eval_data.batch_size=64",
        f"train.run_dir={run_dir}", "train.log_every_steps=4",
    ]


def counting_evaluations(monkeypatch) -> list[int]:
    """Counts `model.evaluate` calls: fit's validations and the runner's own."""
    from tpu_pipeline.model import tf_keras

    calls: list[int] = []
    evaluate = tf_keras.Model.evaluate

    def counted(self, *args, **kwargs):
        calls.append(1)
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(tf_keras.Model, "evaluate", counted)
    return calls


def test_eight_replica_training_with_steps_per_execution_4(small_demo, tmp_path, monkeypatch):
    from tpu_pipeline.train import train

    run_dir = str(tmp_path / "run")
    config = load_config(DEMO_CONFIG, small_overrides(small_demo, run_dir) + [
        "cluster.cpu_replicas=8", "model.steps_per_execution=4", "train.epochs=3",
        "model.schedule.learning_rate=0.01", "train.profile_steps=[4, 6]", "train.seed=0",
    ])
    cluster = resolve(config.cluster)
    assert cluster.num_replicas == 8
    stamped: list[tuple[float, str]] = []  # each printed line, with when it was printed
    evaluations = counting_evaluations(monkeypatch)
    metrics = train(config, cluster=cluster, printer=lambda line: stamped.append((time.perf_counter(), line)))
    lines = [line for _, line in stamped]
    # One validation per epoch, and no second pass after epoch 3's over the same weights (issue 47).
    assert len(evaluations) == 3

    assert metrics["steps"] == 3 * 8 == metrics["epochs"] * metrics["steps_per_epoch"]  # 512 // 64
    losses = metrics["history"]["loss"]
    assert len(losses) == 3 and losses[-1] < losses[0] * 0.95, losses
    assert metrics["cluster"] == {"kind": "cpu", "replicas": 8, "hosts": 1}
    history = metrics["history"]
    assert all(len(history[key]) == 3 for key in ("loss", "accuracy", "val_loss", "val_accuracy")), history
    assert metrics["loss"] == losses[-1] and metrics["accuracy"] == history["accuracy"][-1]
    # The final evaluation is of the final model on the whole eval set: what epoch 3's validation saw.
    assert metrics["eval_loss"] == pytest.approx(history["val_loss"][-1], rel=1e-5), metrics
    assert metrics["eval_accuracy"] == pytest.approx(history["val_accuracy"][-1], abs=1e-6), metrics
    # Three short epochs leave eval accuracy near chance (0.23-0.30 measured), but the model learns:
    # training accuracy ends above chance (0.25 for 4 classes; 0.36-0.38 measured) and above epoch 1's.
    assert history["accuracy"][-1] > max(0.3, history["accuracy"][0]), history
    progress = [line for line in lines if line.startswith("step ")]
    assert progress and all("examples/s | waiting for input" in line for line in progress[1:])
    assert "the first step of a run holds tracing and compilation, and is not timed" in progress[0]  # one execution
    _check_throughput(metrics, progress, [when for when, line in stamped if line.startswith("step ")])
    assert [line.split()[1] for line in progress][:2] == ["4/24", "8/24"]  # one line per execution of 4 steps
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in epochs] == ["epoch 1/3", "epoch 2/3", "epoch 3/3"], lines
    assert all(" val_loss " in line and " val_accuracy " in line and "examples/s | waiting for input" in line
               for line in epochs), epochs
    assert lines[-1] == (f"wrote metrics {run_dir}/metrics.json; checkpoints {run_dir}/checkpoints; TensorBoard logs "
                         f"{run_dir}/tensorboard (tensorboard --logdir {run_dir})")
    saved = [line for line in lines if line.startswith("saved checkpoint")]
    assert [line.split(" at step ")[1] for line in saved] == ["8 (epoch 1)", "16 (epoch 2)", "24 (epoch 3)"]
    on_disk = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert on_disk["steps"] == 24 and on_disk["history"]["loss"] == losses
    assert glob.glob(os.path.join(run_dir, "tensorboard", "train", "events.out.tfevents.*"))
    assert glob.glob(os.path.join(run_dir, "tensorboard", "plugins", "profile", "*", "*.xplane.pb"))


def _check_throughput(metrics: dict, progress: list[str], printed_at: Optional[list[float]] = None) -> None:
    """examples_per_sec and input_wait_fraction against the progress lines they summarize.

    Both count the training steps only (time from a step's start to its end, the first step of the
    run left out: tracing, compilation), and every progress line covers the steps since the one
    before, so each total lies between the smallest and the largest of the lines' printed values
    (rounded to units and percent). Validation, saves and logging happen between steps, so the rate
    is at least the examples over the wall time from the first line to the last (`printed_at`:
    when each line was printed, by the test's own clock) and over train_seconds.
    """
    intervals = []  # (step, examples/s, % waiting) from 'step 8/24 loss ... | 1,619 examples/s | waiting for input 3% of step time'
    for line in progress:
        if "is not timed" in line:
            intervals.append((int(line.split()[1].split("/")[0]), None, None))
            continue
        head, speed, wait = line.split(" | ")
        step = int(head.split()[1].split("/")[0])
        intervals.append((step, float(speed.split()[0].replace(",", "")), float(wait.split()[3].rstrip("%"))))
    timed = [interval for interval in intervals if interval[1] is not None]
    assert timed, progress
    rate, wait = metrics["examples_per_sec"], 100 * metrics["input_wait_fraction"]
    assert min(r for _, r, _ in timed) - 1 <= rate <= max(r for _, r, _ in timed) + 1, (rate, progress)
    assert min(w for _, _, w in timed) - 0.51 <= wait <= max(w for _, _, w in timed) + 0.51, (wait, progress)
    timed_examples = (intervals[-1][0] - intervals[0][0]) * metrics["global_batch_size"]
    assert rate >= timed_examples / metrics["train_seconds"], (rate, metrics)
    if printed_at is not None:
        assert rate >= 0.99 * timed_examples / (printed_at[-1] - printed_at[0]), (rate, progress)


def _train_cli(config_path: str, *extra: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tpu_pipeline.cli", "train", "--config", config_path, *extra],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _logged_losses(lines) -> dict[int, float]:
    """Step → loss from the progress lines ('step 12/30 loss 1.4113 accuracy ...')."""
    losses = {}
    for line in lines:
        words = line.split()
        if line.startswith("step ") and "loss" in words:
            losses[int(words[1].split("/")[0])] = float(words[words.index("loss") + 1])
    return losses


def _model_from_checkpoint(config, path: str, model=None):
    """The demo model built as the runner builds it, with `path` restored into it the way the runner
    resumes (model, optimizer, epoch). Returns (model, epoch)."""
    import tensorflow as tf

    from tpu_pipeline.model import build_model

    if model is None:
        cluster = resolve(config.cluster)
        model = build_model(
            config.model, strategy=cluster.strategy, kind=cluster.kind, input_shape=[32, 32, 3], num_classes=4,
            steps_per_epoch=config.train.steps_per_epoch, epochs=config.train.epochs,
        )
        with cluster.strategy.scope():
            model.optimizer.build(model.trainable_variables)  # the slots exist, so they are restored too
    epoch = tf.Variable(0, dtype=tf.int64)
    status = tf.train.Checkpoint(model=model, optimizer=model.optimizer, epoch=epoch).restore(path)
    try:
        status.assert_existing_objects_matched()  # every weight, slot and counter has a value in the checkpoint
    except AssertionError as error:
        raise AssertionError(f"{path} does not hold the whole training state: {str(error)[:200]} ...") from None
    return model, int(epoch.numpy())


def _values(variables) -> list:
    return [v.numpy().copy() for v in variables]


def test_killed_run_resumes_from_its_last_checkpoint(small_demo, tmp_path):
    import numpy as np
    import tensorflow as tf

    from tpu_pipeline.pipeline import Pipeline

    run_dir = str(tmp_path / "run")
    raw = yaml.safe_load(open(DEMO_CONFIG))
    config_path = str(tmp_path / "config.yaml")
    yaml.safe_dump(raw, open(config_path, "w"))
    args = small_overrides(small_demo, run_dir) + ["train.epochs=5", "train.steps_per_epoch=6"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    first = _train_cli(config_path, *args, env=env)
    output = []
    for line in first.stdout:
        output.append(line)
        if line.startswith("saved checkpoint") and "(epoch 2)" in line:
            first.send_signal(signal.SIGKILL)  # as a preempted VM would: no cleanup, no final save
            break
    first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL, "".join(output)[-3000:]
    assert not os.path.exists(os.path.join(run_dir, "metrics.json"))

    # What the killed run left on disk is a whole training state: the model's weights and the
    # optimizer's slots, restored into a model built as the runner builds it.
    config = load_config(config_path, args)
    checkpoints = tf.train.get_checkpoint_state(os.path.join(run_dir, "checkpoints")).all_model_checkpoint_paths
    assert len(checkpoints) == 2, checkpoints  # after epochs 1 and 2
    model, epoch = _model_from_checkpoint(config, checkpoints[0])
    assert epoch == 1 and int(model.optimizer.iterations.numpy()) == 6
    slots = [v for v in model.optimizer.variables if v.shape.rank and v.shape.num_elements() > 1]
    assert len(slots) >= 2 * len([w for w in model.trainable_weights if w.shape.num_elements() > 1])  # Adam: m and v
    weights_at_6, slots_at_6 = _values(model.weights), _values(slots)
    model, epoch = _model_from_checkpoint(config, checkpoints[1], model)
    assert epoch == 2 and int(model.optimizer.iterations.numpy()) == 12
    weights_at_12, slots_at_12 = _values(model.weights), _values(slots)  # the same model: the same slot objects
    unchanged = [w.name for w, a, b in zip(model.weights, weights_at_6, weights_at_12) if a.size > 1 and np.array_equal(a, b)]
    assert not unchanged, f"the checkpoints of epochs 1 and 2 hold the same values of {unchanged}"
    assert all(not np.array_equal(a, b) for a, b in zip(slots_at_6, slots_at_12)), "optimizer state not saved"
    assert all(np.any(s != 0) for s in slots_at_12), "optimizer slots restored as zeros"

    second = subprocess.run(
        [sys.executable, "-m", "tpu_pipeline.cli", "train", "--config", config_path, *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resumed from" in second.stdout and ": step 12 (epoch 3, step 0 of 6)" in second.stdout
    steps = [int(line.split()[1].split("/")[0]) for line in second.stdout.splitlines() if line.startswith("step ")]
    assert steps and min(steps) > 12, "training restarted from zero"
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert metrics["resumed_from_step"] == 12 and metrics["steps"] == 30
    assert len(metrics["history"]["loss"]) == 5 and metrics["history"]["epoch"] == [1, 2, 3, 4, 5]  # across the resume

    # The resumed run went on from the restored weights: its first logged loss (steps 13-16) is about
    # the killed run's last one (steps 7-12), not the ~1.7 of a model starting again from its
    # initial weights (measured: resumed -0.03..-0.12 from the last loss; restarted +0.24..+0.34).
    before, after = _logged_losses(output), _logged_losses(second.stdout.splitlines())
    assert after[min(after)] < before[12] + 0.1, (before, after)

    # Its final checkpoint holds the model it evaluated: restored here, it scores what metrics.json says.
    final = tf.train.latest_checkpoint(os.path.join(run_dir, "checkpoints"))
    model, epoch = _model_from_checkpoint(config, final)
    assert epoch == 5 and int(model.optimizer.iterations.numpy()) == 30
    evaluation = model.evaluate(Pipeline.from_config(config.eval_data).build(), steps=2, verbose=0, return_dict=True)
    assert np.isclose(evaluation["loss"], metrics["eval_loss"], rtol=1e-4), (evaluation, metrics)
    assert np.isclose(evaluation["accuracy"], metrics["eval_accuracy"], atol=1e-6), (evaluation, metrics)
    unchanged = [w.name for w, at_12 in zip(model.weights, weights_at_12) if w.shape.num_elements() > 1
                 and np.array_equal(w.numpy(), at_12)]
    assert not unchanged, f"18 more steps left these as they were at step 12: {unchanged}"


def test_the_demo_run_learns_and_writes_metrics_json(demo_cache, tmp_path):
    """The README's main job, exactly: `tpu-pipeline train` with no config, on the built-in demo data."""
    run_dir = str(tmp_path / "demo_run")
    # As a user runs it: without the tests' TF_CPP_MIN_LOG_LEVEL, which the CLI would obey as the user's choice.
    env = {**{k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}, "TPU_PIPELINE_CACHE": demo_cache}
    result = subprocess.run(
        [sys.executable, "-m", "tpu_pipeline.cli", "train", f"train.run_dir={run_dir}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    expected_keys = {"loss", "accuracy", "eval_loss", "eval_accuracy", "examples_per_sec", "steps",
                     "epochs", "steps_per_epoch", "input_wait_fraction", "history", "cluster"}
    assert expected_keys <= set(metrics)
    assert metrics["steps"] == 12 * 32 and metrics["steps_per_epoch"] == 4096 // 128
    assert metrics["eval_accuracy"] >= 0.8, metrics  # 4 classes: chance is 0.25
    assert metrics["history"]["loss"][-1] < metrics["history"]["loss"][0]
    assert len(metrics["history"]["loss"]) == 12
    _check_throughput(metrics, [line for line in result.stdout.splitlines() if line.startswith("step ")])
    # Our own INFO lines read like the printed ones, not in absl's glog form (issue 47 item 7), and nothing
    # else in glog form (TensorFlow's INFO lines, native start-up lines) reaches the user.
    output = result.stdout + result.stderr
    assert re.search(r"^model \S+: \d+ parameters", output, re.M), output[-3000:]
    assert not re.search(r"^[IWEF]\d{4} \d\d:\d\d", output, re.M), output[-3000:]


def test_a_run_whose_last_epoch_did_not_validate_evaluates_once_at_its_end(small_demo, tmp_path, monkeypatch):
    from tpu_pipeline.train import train

    config = load_config(DEMO_CONFIG, small_overrides(small_demo, str(tmp_path / "run")) + [
        "train.epochs=3", "train.steps_per_epoch=2", "train.eval_every_epochs=2", "train.tensorboard=false",
        "model.schedule.warmup_epochs=0", "model.cnn.filters=[8]"])
    evaluations = counting_evaluations(monkeypatch)
    # Issue 47 item 5: a line every 30 s while an evaluation runs; here every batch, to see both evaluations say it.
    monkeypatch.setattr("tpu_pipeline.train.callbacks.EVALUATION_LINE_SECONDS", 0.0)
    lines: list[str] = []
    metrics = train(config, printer=lines.append)
    assert len(evaluations) == 2  # epoch 2's validation, then the final one: epoch 3 trained after it
    steps = config.eval_data and len([line for line in lines if line.startswith("evaluating: 1 of ")])
    assert steps == 2, lines  # one first line per evaluation, each naming train.eval_steps
    assert all(line.endswith("(train.eval_steps evaluates fewer batches)")
               for line in lines if line.startswith("evaluating: 1 of ")), lines
    assert any(re.fullmatch(r"evaluating: 2 of \d+ batches in \d+ s, about \d+ s to go", line) for line in lines), lines
    assert len(metrics["history"]["val_loss"]) == 1 and metrics["history"]["epoch"] == [1, 2, 3]
    assert metrics["eval_loss"] != metrics["history"]["val_loss"][-1]  # the final model's, not epoch 2's


def test_a_finished_run_started_again_says_so_and_changes_nothing(small_demo, tmp_path):
    from tpu_pipeline.train import train

    run_dir = str(tmp_path / "run")
    config = load_config(DEMO_CONFIG, small_overrides(small_demo, run_dir) + [
        "train.epochs=1", "train.steps_per_epoch=2", "train.tensorboard=false", "model.schedule.warmup_epochs=0"])
    cluster = resolve(ClusterConfig())
    first = train(config, cluster=cluster, printer=lambda line: None)
    path = os.path.join(run_dir, "metrics.json")
    written, mtime = open(path).read(), os.path.getmtime(path)
    checkpoints = sorted(os.listdir(os.path.join(run_dir, "checkpoints")))

    lines: list[str] = []
    again = train(config, cluster=cluster, printer=lines.append)
    assert again == first and first["eval_accuracy"] is not None and len(first["history"]["loss"]) == 1
    assert open(path).read() == written and os.path.getmtime(path) == mtime  # metrics.json untouched
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == checkpoints
    complete = [line for line in lines if line.startswith("run already complete")]
    assert len(complete) == 1 and "1 of 1 epoch(s), step 2" in complete[0] and path in complete[0], lines
    assert not any(line.startswith(("training ", "step ", "final:")) for line in lines), lines


@pytest.mark.parametrize("signum, by, code", [(signal.SIGTERM, "SIGTERM", 143), (signal.SIGINT, "Ctrl-C", 130)],
                         ids=["sigterm", "ctrl_c"])
def test_sigterm_mid_epoch_saves_stops_and_never_evaluates(small_demo, tmp_path, signum, by, code):
    """A SIGTERM leaves seconds: the Checkpointer saves and raises PreemptionStop out of `fit` (no epoch-end
    validation), and `train` writes the metrics so far and exits 143 without its final evaluation. In process,
    with a real signal (the slow test_preemption.py checks the same through a child). A first Ctrl-C does the
    same and exits 130 (issue 47 item 6: it lost every step since the last checkpoint)."""
    from tpu_pipeline.train import train
    from tpu_pipeline.train.preemption import PreemptionFlag
    from tpu_pipeline.train.runner import Preempted

    run_dir = str(tmp_path / "run")
    config = load_config(DEMO_CONFIG, small_overrides(small_demo, run_dir) + [
        "train.epochs=2", "train.steps_per_epoch=4", "train.tensorboard=false", "model.schedule.warmup_epochs=0",
        "train.log_every_steps=1", "train.checkpoint_every_seconds=null", "model.cnn.filters=[8]",
        "data.batch_size=16", "eval_data.batch_size=16"])
    lines: list[str] = []

    def printer(line: str) -> None:
        lines.append(line)
        if line.startswith("step 2/"):  # mid-epoch 1, whose end would validate
            handler = signal.getsignal(signum)
            assert isinstance(getattr(handler, "__self__", None), PreemptionFlag), handler  # never kill pytest
            signal.raise_signal(signum)

    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(Preempted) as stopped:
        train(config, cluster=resolve(ClusterConfig()), printer=printer)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers  # put back
    assert stopped.value.code == code
    assert [line for line in lines if line.startswith("saved checkpoint")] == [
        f"saved checkpoint {run_dir}/checkpoints/ckpt-2 at step 2 ({by})"], lines
    assert any(line.startswith(f"stopped by {by} at step 2 of 8;") for line in lines), lines
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert metrics["stopped_by_sigterm_at_step"] == 2 == metrics["steps"] and metrics["stopped_by"] == by, metrics
    assert "eval_loss" not in metrics and "eval_accuracy" not in metrics, metrics  # no final evaluation
    assert "val_loss" not in metrics["history"] and not metrics["history"].get("epoch"), metrics  # nor validation


def test_a_second_ctrl_c_quits_at_once(capfd):
    """The first Ctrl-C asks for a save (and says how to skip it), the second raises KeyboardInterrupt at once."""
    from tpu_pipeline.train.preemption import PreemptionFlag

    before = signal.getsignal(signal.SIGINT)
    with PreemptionFlag() as flag:
        signal.raise_signal(signal.SIGINT)
        assert flag.requested and flag.stopped_by == "Ctrl-C" and flag.exit_code == 130
        assert "press Ctrl-C again to quit at once without saving" in capfd.readouterr().err
        signal.raise_signal(signal.SIGTERM)  # a SIGTERM after it changes nothing: Ctrl-C asked first
        assert flag.stopped_by == "Ctrl-C"
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_training_config_errors_name_the_key(small_demo, tmp_path):
    from tpu_pipeline.errors import ConfigError
    from tpu_pipeline.train import train

    config = load_config(DEMO_CONFIG, small_overrides(small_demo, str(tmp_path)) + ["data.outputs=null"])
    with pytest.raises(ConfigError, match="data.outputs"):
        train(config, cluster=resolve(ClusterConfig()), printer=lambda line: None)
    glob_only = load_config(DEMO_CONFIG, small_overrides(small_demo, str(tmp_path)) + [
        "data.source.dir=null", "data.source.split=null", f"data.source.files={small_demo}/train-*.tfrecord",
    ])
    with pytest.raises(ConfigError, match=r"train.num_classes: not set"):
        train(glob_only, cluster=resolve(ClusterConfig()), printer=lambda line: None)
    with pytest.raises(ConfigError, match=r"train.profile_steps"):
        load_config(DEMO_CONFIG, ["train.profile_steps=[9, 3]"])


def run_files(run_dir: str, worker_id: int, is_chief: bool):
    """RunFiles as worker `worker_id` of a two-worker TF_CONFIG cluster (what `resolve` tells each process)."""
    import tensorflow as tf

    from tpu_pipeline.cluster import ClusterInfo
    from tpu_pipeline.train.run_files import RunFiles

    cluster = ClusterInfo(strategy=tf.distribute.get_strategy(), kind="multi-worker", num_replicas=2, num_hosts=2,
                          devices=("/cpu:0",), worker_id=worker_id, is_chief=is_chief)
    checkpoint = tf.train.Checkpoint(step=tf.Variable(worker_id, dtype=tf.int64))
    return RunFiles(run_dir, cluster, checkpoint, max_to_keep=2)


def test_only_the_chief_writes_metrics_json(tmp_path):
    """Both workers of the two-worker test rename to the same path, so only a worker alone can show
    that a non-chief writes nothing: its metrics would overwrite the chief's (or race with them)."""
    from tpu_pipeline.train.run_files import read_metrics

    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    other = run_files(run_dir, worker_id=1, is_chief=False)
    assert other.write_metrics({"worker": 1}) is None
    assert os.listdir(run_dir) == [], "a non-chief worker wrote into run_dir"
    assert read_metrics(run_dir) is None

    chief = run_files(run_dir, worker_id=0, is_chief=True)
    assert chief.write_metrics({"worker": 0}) == os.path.join(run_dir, "metrics.json")
    assert other.write_metrics({"worker": 1}) is None
    assert read_metrics(run_dir) == {"worker": 0}
    assert sorted(os.listdir(run_dir)) == ["metrics.json"]  # no temporary file left either


def test_a_non_chief_checkpoint_leaves_only_the_chiefs(tmp_path):
    """Every worker saves (a save runs collectives), but a non-chief's files go and only the chief's path is named."""
    run_dir = str(tmp_path / "run")
    chief, other = run_files(run_dir, 0, True), run_files(run_dir, 1, False)
    kept = chief.save_checkpoint(step=7)
    assert other.save_checkpoint(step=7) == kept == os.path.join(run_dir, "checkpoints", "ckpt-7")
    assert sorted(os.listdir(run_dir)) == ["checkpoints"], "the non-chief's temporary directory was left"
    assert run_files(run_dir, 1, False).latest_checkpoint == kept  # what a restarted non-chief restores
