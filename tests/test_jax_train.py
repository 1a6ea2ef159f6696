"""`train` on Keras 3 JAX (model.framework: jax, or KERAS_BACKEND=jax), fed by our per-host pipelines.

Real child processes with 8 JAX CPU devices: SIGKILLs and a SIGTERM, then the same command again. Each
device's slice of every global batch is logged from inside the jitted train step (`jax.debug.callback`)
and checked against the per-replica batches the TF path's `tf.distribute` strategy hands out for the
same config: the JAX path trains every device on exactly what the same replica gets on TensorFlow.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys

import pytest

from jax_child import jax_env, requires_jax
from test_preemption import CHILD, REPO, assert_exact_epochs, interrupt, max_step, read_log, train_config

pytestmark = [pytest.mark.tf_builds, pytest.mark.slow, requires_jax]


def _env(**extra: str) -> dict:
    env = jax_env(extra={"PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([REPO, os.path.dirname(CHILD)]),
                         **extra})
    return env


def tf_path_batches(config: dict, strategy, steps: int) -> dict[tuple[int, int], list[int]]:
    """(step, replica) → the label ids the TF path's strategy hands replica `replica` at step `step`."""
    from tpu_pipeline.config import config_from_dict
    from tpu_pipeline.pipeline import Pipeline

    data = config_from_dict(config).data.model_copy(update={"repeat": "forever"})
    dataset = strategy.distribute_datasets_from_function(Pipeline.from_config(data).build)
    batches = {}
    for step, element in zip(range(steps), dataset):
        for replica, labels in enumerate(strategy.experimental_local_results(element[1])):
            batches[(step, replica)] = [int(i) for i in labels.numpy()]
    return batches


def test_jax_train_on_eight_devices_killed_and_terminated_resumes_exactly_as_the_tf_path_feeds(
        tmp_path, eight_replica_strategy):
    """model.framework: jax in the config alone (no KERAS_BACKEND): 3 SIGKILLs, a SIGTERM (exit 143), then the rest
    on 4 devices at half the global batch, going on by examples trained (issue 51, item 2, on JAX)."""
    from tpu_pipeline.records.demo_shapes import ensure_demo_dataset

    data_dir = ensure_demo_dataset(str(tmp_path / "data"), num_train=512, num_eval=64, size=16, num_shards=8)
    run_dir, out_dir = str(tmp_path / "run"), str(tmp_path / "out")
    os.makedirs(out_dir)
    config = train_config(data_dir, run_dir)
    config["model"]["framework"] = "jax"
    config["train"]["epochs"] = 3
    config_path = str(tmp_path / "config.json")
    json.dump(config, open(config_path, "w"))
    env = _env()
    env.pop("KERAS_BACKEND")
    env.pop("XLA_FLAGS")  # cluster.cpu_replicas: 8 makes the 8 JAX devices
    command = [sys.executable, CHILD, "train_jax", config_path, out_dir]
    rng = random.Random(3)
    for kill in range(3):
        result = interrupt(command, out_dir, max_step(out_dir) + rng.randint(2, 4), signal.SIGKILL, env=env)
        assert result.returncode == -signal.SIGKILL, f"kill {kill}:\n{result.stdout[-3000:]}"
    result = interrupt(command, out_dir, max_step(out_dir) + 1, signal.SIGTERM, env=env)
    assert result.returncode == 143, result.stdout[-3000:]
    assert "Keras 3 on JAX" in result.stdout and "8 replicas" in result.stdout
    stopped = [line for line in result.stdout.splitlines() if line.startswith("stopped by SIGTERM at step")]
    assert stopped, result.stdout[-3000:]
    sigterm_step = int(stopped[0].split()[5])

    # The rest on 4 of the JAX devices with half the global batch (each device's batch kept): the step is rebased
    # to the examples trained / 32, and the input goes on from the same example.
    four = {**config, "data": {**config["data"], "batch_size": 32}, "cluster": {"cpu_replicas": 4},
            "train": {**config["train"], "allow_changes": ["data.batch_size"]}}
    four_path = str(tmp_path / "four.json")
    json.dump(four, open(four_path, "w"))
    final = subprocess.run([sys.executable, CHILD, "train_jax", four_path, out_dir], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    rebased, steps = 2 * sigterm_step, 3 * (512 // 32)
    assert (f"data.batch_size 64 -> 32: the run goes on by examples trained, {64 * sigterm_step:,}: "
            f"step {sigterm_step} -> {rebased}") in final.stdout, final.stdout[-3000:]
    assert f"continue from example {64 * sigterm_step:,} of the training stream" in final.stdout, final.stdout[-3000:]
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert metrics["steps"] == steps and metrics["resumed_from_step"] == rebased
    assert metrics["history"]["epoch"] == [1, 2, 3], metrics["history"]
    assert metrics["cluster"] == {"kind": "cpu", "replicas": 4, "hosts": 1}

    log = read_log(out_dir)
    assert sorted({step for step, _ in log}) == list(range(sigterm_step)) + list(range(rebased, steps))
    # Up to the SIGTERM (three resumes after SIGKILLs among them), each device took what the TF path feeds it.
    before = {key: value for key, value in log.items() if key[0] < sigterm_step}
    assert before == tf_path_batches(config, eight_replica_strategy, sigterm_step)
    assert all(len(log[(step, device)]) == 8 for step in range(rebased, steps) for device in range(4))
    stream = [i for step in sorted({step for step, _ in log}) for device in range(8)
              for i in log.get((step, device), [])]
    assert_exact_epochs([stream], 512, 512)


def test_jax_train_of_a_packed_mixture_killed_and_resumed_trains_on_the_documents_of_the_tf_path(tmp_path):
    """KERAS_BACKEND=jax alone switches the text LM config: a mixture packed into rows, rows shuffled in pools,
    two steps per execution; killed three times, then run to the end. Each device's documents at each step are
    those the same replica trains on, never interrupted, on the TF path."""
    from test_mixture_train import EPOCHS, REPLICAS, mixture_config
    from test_text_lm import uninterrupted_documents

    raw = mixture_config(tmp_path)
    raw["train"]["steps_per_epoch"] = STEPS = 8  # on JAX, steps_per_execution (2) must divide an epoch
    out_dir = str(tmp_path / "killed")
    os.makedirs(out_dir)
    config_path = os.path.join(out_dir, "config.json")
    json.dump(raw, open(config_path, "w"))
    env = _env()
    env.pop("XLA_FLAGS")  # cluster.cpu_replicas makes the devices
    command = [sys.executable, CHILD, "train_lm_jax", config_path, out_dir]
    rng = random.Random(5)
    for kill in range(3):
        result = interrupt(command, out_dir, max_step(out_dir) + rng.randint(2, 4), signal.SIGKILL, env=env)
        assert result.returncode == -signal.SIGKILL, f"kill {kill}:\n{result.stdout[-3000:]}"
    final = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    assert "resumed from" in final.stdout and "Keras 3 on JAX" in final.stdout, final.stdout[-3000:]
    killed = read_log(out_dir)

    steps = STEPS * EPOCHS
    assert killed == uninterrupted_documents(raw, steps=steps, replicas=REPLICAS)
    metrics = json.load(open(os.path.join(raw["train"]["run_dir"], "metrics.json")))
    assert metrics["steps"] == steps and metrics["tokens_per_sec"] > 0 and "mixture" in metrics
