"""The training job: 8-replica fit, checkpoints, kill-and-resume, profiler, and the demo's metrics."""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys

import pytest
import yaml

from tpu_pipeline.cluster import resolve
from tpu_pipeline.config import load_config
from tpu_pipeline.config.cluster import ClusterConfig
from tpu_pipeline.records import ensure_demo_dataset

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


def test_eight_replica_training_with_steps_per_execution_4(small_demo, tmp_path):
    from tpu_pipeline.train import train

    run_dir = str(tmp_path / "run")
    config = load_config(DEMO_CONFIG, small_overrides(small_demo, run_dir) + [
        "cluster.cpu_replicas=8", "model.steps_per_execution=4", "train.epochs=3",
        "model.schedule.learning_rate=0.01", "train.profile_steps=[4, 6]", "train.seed=0",
    ])
    cluster = resolve(config.cluster)
    assert cluster.num_replicas == 8
    lines: list[str] = []
    metrics = train(config, cluster=cluster, printer=lines.append)

    assert metrics["steps"] == 3 * 8 == metrics["epochs"] * metrics["steps_per_epoch"]  # 512 // 64
    losses = metrics["history"]["loss"]
    assert len(losses) == 3 and losses[-1] < losses[0] * 0.95, losses
    assert metrics["cluster"] == {"kind": "cpu", "replicas": 8, "hosts": 1}
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0 and metrics["examples_per_sec"] > 0
    assert 0.0 <= metrics["input_wait_fraction"] <= 1.0
    progress = [line for line in lines if line.startswith("step ")]
    assert progress and all("examples/s | waiting for input" in line for line in progress)
    assert [line.split()[1] for line in progress][:2] == ["4/24", "8/24"]  # one line per execution of 4 steps
    saved = [line for line in lines if line.startswith("saved checkpoint")]
    assert [line.split(" at step ")[1] for line in saved] == ["8 (epoch 1)", "16 (epoch 2)", "24 (epoch 3)"]
    on_disk = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert on_disk["steps"] == 24 and on_disk["history"]["loss"] == losses
    assert glob.glob(os.path.join(run_dir, "tensorboard", "train", "events.out.tfevents.*"))
    assert glob.glob(os.path.join(run_dir, "tensorboard", "plugins", "profile", "*", "*.xplane.pb"))


def _train_cli(config_path: str, *extra: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tpu_pipeline.cli", "train", "--config", config_path, *extra],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_killed_run_resumes_from_its_last_checkpoint(small_demo, tmp_path):
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

    second = subprocess.run(
        [sys.executable, "-m", "tpu_pipeline.cli", "train", "--config", config_path, *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resumed from" in second.stdout and ": step 12, epoch 2" in second.stdout
    steps = [int(line.split()[1].split("/")[0]) for line in second.stdout.splitlines() if line.startswith("step ")]
    assert steps and min(steps) > 12, "training restarted from zero"
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert metrics["resumed_from_step"] == 12 and metrics["steps"] == 30
    assert len(metrics["history"]["loss"]) == 3  # epochs 3..5 only


def test_the_demo_run_learns_and_writes_metrics_json(demo_cache, tmp_path):
    """The README's main job, exactly: `tpu-pipeline train` with no config, on the built-in demo data."""
    run_dir = str(tmp_path / "demo_run")
    env = {**os.environ, "TPU_PIPELINE_CACHE": demo_cache}
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
    assert metrics["examples_per_sec"] > 0


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
