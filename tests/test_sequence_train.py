"""`train` on packed or bucketed input resumes exactly: the checkpoint holds the window and the outputs
of it delivered, and they are those of the uninterrupted stream at the saved step.

A windowed pipeline's position cannot be computed from the step (a batch holds as many examples as
the data packs into it), so `fit`'s consumption is logged (`PositionLog`); the test compares what
`train` saved with what the package's own iterator reaches after as many steps, with 8 replicas.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.cluster import resolve
from tpu_pipeline.config import config_from_dict
from tpu_pipeline.config.cluster import ClusterConfig
from tpu_pipeline.config.data import FeatureConfig
from tpu_pipeline.model import tf_keras
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.records.writer import int_feature, write_split

pytestmark = pytest.mark.tf_builds

VOCAB = 50


def write_token_records(directory, count: int = 240) -> str:
    rng = np.random.default_rng(7)

    def examples():
        for index in range(count):
            tokens = rng.integers(0, VOCAB, int(rng.integers(1, 40))).tolist()
            feature = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens)), "id": int_feature(index)}
            yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    write_split(examples(), str(directory), "train", 3, "")
    return str(directory / "train-*")


def config(files: str, run_dir: str, mode: str, epochs: int):
    sequence = {"keys": ["tokens"], "length": 32, "mode": mode, "overflow": "truncate", "window": 48}
    features = {"tokens": {"dtype": "int64", "kind": "ragged"}}
    outputs = {"inputs": "tokens", "targets": "tokens"}
    if mode == "bucket":
        sequence["boundaries"] = [16, 32]
    return config_from_dict({
        "data": {"source": {"type": "tfrecord", "files": files}, "features": features, "sequence": sequence,
                 "batch_size": 16, "repeat": "forever", "seed": 5, "outputs": outputs},
        "train": {"epochs": epochs, "steps_per_epoch": 3, "run_dir": run_dir, "checkpoint_every_steps": 2,
                  "tensorboard": False, "num_classes": VOCAB},
        "cluster": {"cpu_replicas": 8},
    })


def per_token_model(input_shape, num_classes):
    tokens = tf_keras.Input([None], dtype=tf.int32)
    return tf_keras.Model(tokens, tf_keras.layers.Dense(VOCAB)(tf_keras.layers.Embedding(VOCAB, 4)(tokens)))


def saved_position(run_dir: str) -> tuple[int, int, int]:
    """(example, chunk, in_window) of the one input pipeline: the checkpoint holds a vector, one entry per host."""
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(f"{run_dir}/checkpoints"))
    saved = [reader.get_tensor(f"data/{name}/.ATTRIBUTES/VARIABLE_VALUE") for name in ("example", "chunk", "in_window")]
    assert all(value.shape == (1,) for value in saved), saved
    return tuple(int(value[0]) for value in saved)


def iterator_position(iterator) -> tuple[int, int, int]:
    return int(iterator.example.numpy()), int(iterator.chunk.numpy()), int(iterator.in_window.numpy())


@pytest.mark.parametrize("mode", ["pack", "bucket"])
def test_train_saves_the_windowed_position_of_the_uninterrupted_stream(tmp_path, mode):
    from tpu_pipeline.train import train

    files = write_token_records(tmp_path / "data")
    cluster = resolve(ClusterConfig(cpu_replicas=8))
    run_dir = str(tmp_path / "run")
    train(config(files, run_dir, mode, 1), cluster=cluster, model_fn=per_token_model, printer=lambda line: None)
    after_three = saved_position(run_dir)
    lines: list[str] = []
    metrics = train(config(files, run_dir, mode, 3), cluster=cluster, model_fn=per_token_model, printer=lines.append)
    assert metrics["resumed_from_step"] == 3 and metrics["steps"] == 9
    # What it trained on, counted where the segment ids and masks are: packed rows are nearly full.
    assert (0.9 if mode == "pack" else 0.3) < metrics["non_padding_fraction"] <= 1.0, metrics["non_padding_fraction"]
    assert any("the input pipeline continues from the window at example" in line for line in lines), lines

    iterator = Pipeline.from_config(config(files, run_dir, mode, 3).data).distributed_iterator(cluster.strategy)
    for step in range(1, 10):
        next(iterator)
        if step == 3:
            assert after_three == iterator_position(iterator)
    assert saved_position(run_dir) == iterator_position(iterator)
    assert saved_position(run_dir) != after_three


def test_exact_evaluation_of_packed_input_counts_every_token_once_in_equal_static_steps(tmp_path):
    """Two input pipelines x 8 replicas: rows are counted by a pass, the last batch and steps padded with
    zero-weight rows (segment ids 0), and every token of every example (cut to the length) is in one row."""
    files = write_token_records(tmp_path / "data", count=150)
    data = config(files, str(tmp_path / "run"), "pack", 1).data.model_copy(update={"repeat": 1})
    data = data.model_copy(update={"outputs": data.outputs.model_copy(update={"inputs": ["tokens", "tokens_segment_ids"]})})
    pipeline = Pipeline.from_config(data).for_evaluation()
    steps = pipeline.evaluation_steps(8, 2)
    real_tokens, padding_rows = 0, 0
    for index in range(2):
        batches = list(pipeline.build(tf.distribute.InputContext(2, index, 8)))
        assert len(batches) == steps * 4  # each pipeline feeds 4 replicas per step
        for inputs, targets, weights in batches:
            segments, weights = inputs["tokens_segment_ids"].numpy(), weights.numpy()
            assert segments.shape == (2, 32) and targets.shape == (2, 32)
            assert ((segments > 0).any(axis=1) == (weights > 0)).all()  # weight 1 exactly on rows with tokens
            real_tokens += int((segments > 0).sum())
            padding_rows += int((weights == 0).sum())
    stored = sum(min(32, len(tf.train.Example.FromString(record.numpy()).features.feature["tokens"].int64_list.value))
                 for record in tf.data.TFRecordDataset(sorted(tf.io.gfile.glob(files))))
    assert real_tokens == stored and padding_rows > 0


def test_exact_evaluation_of_bucketed_input_weighs_each_example_once_in_equal_steps(tmp_path):
    """Two input pipelines x 8 replicas: every example once with weight 1, padding examples weight 0,
    the same number of steps on both pipelines, and each step one shape on every replica."""
    files = write_token_records(tmp_path / "data", count=150)
    data = config(files, str(tmp_path / "run"), "bucket", 1).data.model_copy(update={"repeat": 1})
    data = data.model_copy(update={"features": {**data.features, "id": FeatureConfig(dtype="int64")},
                                   "outputs": data.outputs.model_copy(update={"inputs": ["tokens", "id"]})})
    pipeline = Pipeline.from_config(data).for_evaluation()
    steps = pipeline.evaluation_steps(8, 2)
    ids, shapes = [], {0: [], 1: []}
    for index in range(2):
        batches = list(pipeline.build(tf.distribute.InputContext(2, index, 8)))
        assert len(batches) == steps * 4
        for inputs, targets, weights in batches:
            shapes[index].append(inputs["tokens"].shape)
            ids += [int(i) for i, w in zip(inputs["id"].numpy(), weights.numpy()) if w == 1.0]
            assert set(weights.numpy().tolist()) <= {0.0, 1.0}
    assert sorted(ids) == list(range(150))
    for step in range(steps):
        assert len({*shapes[0][4 * step:4 * step + 4], *shapes[1][4 * step:4 * step + 4]}) == 1
