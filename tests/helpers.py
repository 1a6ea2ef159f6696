"""Test data: real TFRecord files holding real JPEG bytes, with an `id` per example."""
from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from tpu_pipeline.records.writer import bytes_feature, int_feature, write_split


def jpeg_examples(num: int, size: int = 24, seed: int = 0):
    """Serialized tf.Examples: a real JPEG (random size around `size`), label = id % 4, and id."""
    rng = np.random.default_rng(seed)
    for index in range(num):
        height, width = size + int(rng.integers(0, 8)), size + int(rng.integers(0, 8))
        pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
        jpeg = tf.io.encode_jpeg(pixels, quality=90).numpy()
        feature = {"image": bytes_feature(jpeg), "label": int_feature(index % 4), "id": int_feature(index)}
        yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_jpeg_shards(directory: str, num: int, num_shards: int, size: int = 24, compression: str = "") -> str:
    """Writes the shards and returns their glob."""
    write_split(jpeg_examples(num, size), str(directory), "train", num_shards, compression)
    suffix = ".gz" if compression == "GZIP" else ""
    return os.path.join(str(directory), f"train-*.tfrecord{suffix}")


def data_config(files: str, **overrides) -> dict:
    """A complete deterministic image data section over `files` (a plain dict, as from YAML)."""
    config = {
        "source": {"type": "tfrecord", "files": files, "cycle_length": 4, "deterministic": True},
        "features": {"image": {"dtype": "string"}, "label": {"dtype": "int64"}, "id": {"dtype": "int64"}},
        "preprocess": [
            {"op": "decode_image", "format": "jpeg"},
            {"op": "resize", "size": 16},
            {"op": "cast", "key": "image", "dtype": "bfloat16"},
            {"op": "cast", "key": "label", "dtype": "int32"},
            {"op": "cast", "key": "id", "dtype": "int32"},
        ],
        "shuffle": {"buffer_size": 64},
        "seed": 1,
        "repeat": 1,
        "batch_size": 32,
        "options": {"deterministic": True},
    }
    for key, value in overrides.items():
        config[key] = value
    return config


def small_examples(values: np.ndarray):
    """Serialized tf.Examples like the W2 benchmark: 16 floats (a row of `values`), a label and an id."""
    for index in range(len(values)):
        feature = {
            "features": tf.train.Feature(float_list=tf.train.FloatList(value=values[index].tolist())),
            "label": int_feature(index % 3),
            "id": int_feature(index),
        }
        yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_small_shards(directory: str, num: int, num_shards: int) -> tuple[str, np.ndarray]:
    """Writes the shards; returns their glob and the float rows by id (to check parsed values)."""
    values = np.random.default_rng(0).normal(size=(num, 16)).astype(np.float32)
    write_split(small_examples(values), str(directory), "train", num_shards)
    return os.path.join(str(directory), "train-*.tfrecord"), values


def small_config(files: str, **overrides) -> dict:
    config = {
        "source": {"type": "tfrecord", "files": files, "cycle_length": 4, "deterministic": True},
        "features": {"features": {"dtype": "float32", "shape": [16]}, "label": {"dtype": "int64"}, "id": {"dtype": "int64"}},
        "augment": [{"op": "cast", "key": "label", "dtype": "int32"}, {"op": "cast", "key": "id", "dtype": "int32"}],
        "shuffle": {"buffer_size": 1000},
        "seed": 3,
        "repeat": 1,
        "batch_size": 64,
        "drop_remainder": False,
        "options": {"deterministic": True},
    }
    config.update(overrides)
    return config


def plan_of(config):
    """The plan a data config gets: every decision the pipeline makes, with its reason."""
    from tpu_pipeline.pipeline import Pipeline

    return Pipeline.from_config(config).plan


def kill_convert_after_shards(args: list[str], out, log_path, shards: int = 3) -> None:
    """Runs `tpu-pipeline convert ARGS` (each shard slowed down) and SIGKILLs it once `shards` shards are
    finished: no cleanup code runs, as on a preempted VM."""
    import subprocess
    import sys
    import time

    from tpu_pipeline.records.convert import STATE_DIR
    from tpu_pipeline.records.shard_pause import SHARD_DELAY_ENV

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "tpu_pipeline.cli", "convert", *args], cwd=repo,
                                   env={**os.environ, SHARD_DELAY_ENV: "0.4"}, stdout=log, stderr=log)
        state = out / STATE_DIR
        deadline = time.time() + 120
        while time.time() < deadline and process.poll() is None:
            if state.is_dir() and len(list(state.glob("*.tfrecord.json"))) >= shards:
                break
            time.sleep(0.05)
        assert process.poll() is None, "the conversion ended before it could be interrupted"
        process.kill()
        process.wait()


def run_together(commands: list[list[str]], timeout: float, envs: list[dict] | None = None, **popen) -> list:
    """Runs independent commands as child processes at the same time and returns, in order, a
    subprocess.CompletedProcess for each (text stdout and stderr), as subprocess.run(capture_output=True,
    text=True) would have one after another: for tests whose CLI runs share nothing, so that one's start-up
    (importing TensorFlow, mostly) and waits overlap the other's. `envs`: one environment per command (else
    `env`, or this process's, for all). A timeout kills them all and raises."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    envs = envs or [popen.pop("env", None)] * len(commands)
    children = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **popen)
                for command, env in zip(commands, envs)]
    try:  # each child's pipes read by a thread of its own: a full pipe never holds one child back for another
        with ThreadPoolExecutor(len(children)) as pool:
            outputs = list(pool.map(lambda child: child.communicate(timeout=timeout), children))
        return [subprocess.CompletedProcess(command, child.returncode, stdout, stderr)
                for command, child, (stdout, stderr) in zip(commands, children, outputs)]
    finally:
        for child in children:
            if child.poll() is None:  # a timeout (or an error) here: none is left running
                child.kill()
                child.communicate()
