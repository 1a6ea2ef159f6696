"""Exact resume of the input position: a pipeline built at `start` is the rest of the uninterrupted
stream, batch for batch and value for value (random augmentation included), with the default
settings, and iterators that tf.train.Checkpoint saves in a few bytes restore it in a new object.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.ops import register_op, scoped_ops
from tpu_pipeline.pipeline import Pipeline

from helpers import write_jpeg_shards, write_small_shards

pytestmark = pytest.mark.tf_builds

EPOCHS = 3


@pytest.fixture(autouse=True)
def noise_op():
    """A random op that works on whole batches, so batch-then-parse pipelines draw seeds too."""
    with scoped_ops():
        @register_op("test_noise", random=True, batchable=True)
        def test_noise():
            return lambda features, seed=None: {
                **features, "features": features["features"] + tf.random.stateless_uniform(tf.shape(features["features"]), seed)}
        yield


def write_data(directory, parse: str) -> str:
    if parse == "per_example":
        return write_jpeg_shards(directory, 96, 5, size=8)
    return write_small_shards(directory, 700, 3)[0]


def default_config(parse: str, files: str, num_pipelines: int, records: bool):
    """The defaults users get (shuffle on, record cache as asked, unset order), with a random op."""
    if parse == "per_example":
        features = {"image": {"dtype": "string"}, "id": {"dtype": "int64"}}
        ops = [{"op": "decode_and_random_crop_jpeg", "size": 4}]
    else:
        features = {"features": {"dtype": "float32", "shape": [16]}, "id": {"dtype": "int64"}}
        ops = [{"op": "test_noise"}]
    raw = {
        "source": {"type": "tfrecord", "files": files},
        "features": features,
        "augment": ops,
        "batch_size": 8 * num_pipelines,
        "repeat": EPOCHS,
        "shuffle": {"buffer_size": 64},
        "cache": {"records": records},
    }
    return config_from_dict({"data": raw}).data


def context(pipeline_id: int, num_pipelines: int) -> tf.distribute.InputContext:
    return tf.distribute.InputContext(num_pipelines, pipeline_id, num_pipelines)


def batches(dataset: tf.data.Dataset) -> list[dict[str, np.ndarray]]:
    return [{key: value.numpy() for key, value in batch.items()} for batch in dataset]


def assert_same(got: list[dict], expected: list[dict], what: str) -> None:
    assert len(got) == len(expected), f"{what}: {len(got)} batches, expected {len(expected)}"
    for index, (a, b) in enumerate(zip(got, expected)):
        assert (a["id"] == b["id"]).all(), f"{what}: batch {index} has ids {a['id']}, expected {b['id']}"
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{what}: batch {index}, {key}")


@pytest.mark.parametrize("num_pipelines", [1, 2])
@pytest.mark.parametrize("records", [False, True], ids=["no_record_cache", "record_cache"])
@pytest.mark.parametrize("parse", ["per_example", "batched"])
def test_a_resumed_stream_is_the_rest_of_the_uninterrupted_one(tmp_path, parse, records, num_pipelines):
    tf.random.set_seed(0)  # as train.seed does: the data's seeds must not depend on TF's global one
    files = write_data(tmp_path, parse)
    pipeline = Pipeline.from_config(default_config(parse, files, num_pipelines, records))
    assert pipeline.plan.parse.value == parse and pipeline.plan.record_cache.value is records
    for pipeline_id in range(num_pipelines):
        ctx = context(pipeline_id, num_pipelines)
        full = batches(pipeline.build(ctx))
        per_epoch = len(full) // EPOCHS
        ids = [int(i) for batch in full for i in batch["id"]]
        length = pipeline.source.epoch_length(ctx)
        for epoch in range(len(ids) // length):  # each whole epoch of this pipeline: its share, each once
            share = ids[epoch * length:(epoch + 1) * length]
            assert len(set(share)) == length
        # Positions inside epoch 1, at an epoch's last batch, into epoch 2, and the last batch.
        for k in sorted({1, per_epoch // 2, per_epoch - 1, per_epoch + 3, 2 * per_epoch + 1, len(full) - 1}):
            resumed = batches(pipeline.build(ctx, start=k * 8))
            assert_same(resumed, full[k:], f"pipeline {pipeline_id} resumed at batch {k}")


def test_a_decoded_cache_resumes_exactly_too(tmp_path):
    tf.random.set_seed(0)
    files = write_jpeg_shards(tmp_path, 64, 4, size=8)
    raw = {
        "source": {"type": "tfrecord", "files": files},
        "features": {"image": {"dtype": "string"}, "id": {"dtype": "int64"}},
        "preprocess": [{"op": "decode_image", "format": "jpeg"}, {"op": "resize", "size": 8}],
        "augment": [{"op": "random_flip"}],
        "cache": {"enabled": True},
        "batch_size": 8, "repeat": EPOCHS, "shuffle": {"buffer_size": 16},
    }
    pipeline = Pipeline.from_config(config_from_dict({"data": raw}).data)
    full = batches(pipeline.build())
    for k in (3, 9, 17):
        assert_same(batches(pipeline.build(start=k * 8)), full[k:], f"resumed at batch {k}")


def test_iterators_are_checkpointed_by_position_and_restored_in_a_new_object(tmp_path, eight_replica_strategy):
    files = write_data(tmp_path, "batched")
    pipeline = Pipeline.from_config(default_config("batched", files, 1, True).model_copy(update={"batch_size": 64}))
    # One input pipeline.
    iterator = pipeline.iterator()
    first = [next(iterator)["id"].numpy() for _ in range(5)]
    prefix = str(tmp_path / "ckpt")
    path = tf.train.Checkpoint(data=iterator).write(prefix)
    expected = [next(iterator)["id"].numpy() for _ in range(4)]
    fresh = Pipeline.from_config(default_config("batched", files, 1, True).model_copy(update={"batch_size": 64})).iterator()
    tf.train.Checkpoint(data=fresh).read(path).assert_consumed()
    assert [next(fresh)["id"].numpy().tolist() for _ in range(4)] == [e.tolist() for e in expected]
    assert first[0].tolist() != expected[0].tolist()

    # A strategy's global steps (8 replicas, one input pipeline feeding them in turn).
    def ids_of(step) -> list[int]:
        parts = eight_replica_strategy.experimental_local_results(step["id"])
        return [int(i) for part in parts for i in part.numpy()]

    distributed = pipeline.distributed_iterator(eight_replica_strategy)
    for _ in range(3):
        next(distributed)
    path = tf.train.Checkpoint(data=distributed).write(str(tmp_path / "dist"))
    expected_steps = [ids_of(next(distributed)) for _ in range(3)]
    restored = pipeline.distributed_iterator(eight_replica_strategy)
    tf.train.Checkpoint(data=restored).read(path).assert_consumed()
    assert [ids_of(next(restored)) for _ in range(3)] == expected_steps


def test_the_saved_position_is_a_few_bytes_whatever_the_buffers(tmp_path):
    """Large records (64 KiB), a shuffle buffer holding all of them, the record cache: the saved
    iterator state stays under 1 KB (tf.data's own iterator checkpoint saves the buffers)."""
    directory = tmp_path / "big"
    directory.mkdir()
    rng = np.random.default_rng(0)
    path = str(directory / "train-00000-of-00001.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for index in range(64):
            feature = {"blob": tf.train.Feature(bytes_list=tf.train.BytesList(value=[rng.bytes(64 * 1024)])),
                       "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[index]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    raw = {"source": {"type": "tfrecord", "files": path},
           "features": {"blob": {"dtype": "string"}, "id": {"dtype": "int64"}},
           "batch_size": 4, "shuffle": {"buffer_size": 10_000}, "cache": {"records": True}}
    iterator = Pipeline.from_config(config_from_dict({"data": raw}).data).iterator()
    for _ in range(7):
        next(iterator)
    prefix = tf.train.Checkpoint(data=iterator).write(str(tmp_path / "state"))
    size = sum(tf.io.gfile.stat(p).length for p in tf.io.gfile.glob(prefix + "*"))
    assert size < 1024, f"the saved input position takes {size} bytes"

    tf_iterator = iter(Pipeline.from_config(config_from_dict({"data": raw}).data).build())
    for _ in range(7):
        next(tf_iterator)
    their = tf.train.Checkpoint(data=tf_iterator).write(str(tmp_path / "tfdata"))
    their_size = sum(tf.io.gfile.stat(p).length for p in tf.io.gfile.glob(their + "*"))
    print(f"saved input position: ours {size} bytes, tf.data iterator {their_size:,} bytes")
    assert their_size > 100 * size  # what index-based state spares: tf.data saved the buffered records


def restored_rests(make_iterator, positions, directory, read) -> dict[int, list]:
    """Checkpoints one fresh iterator after k elements for each k of `positions`, restores a new
    iterator from each checkpoint (as a restarted process does) and returns what each delivers
    (each element as `read` gives it)."""
    iterator, taken, paths = make_iterator(), 0, {}
    for k in sorted(positions):
        for _ in range(k - taken):
            next(iterator)
        taken = k
        paths[k] = tf.train.Checkpoint(data=iterator).write(str(directory / f"after-{k}"))
    rests = {}
    for k, path in paths.items():
        restored = make_iterator()
        tf.train.Checkpoint(data=restored).read(path).assert_consumed()
        assert int(restored.position.numpy()) == k
        rests[k] = [read(element) for element in restored]
    return rests


@pytest.mark.parametrize("distributed", [False, True], ids=["pipeline_iterator", "distributed_iterator"])
def test_a_restored_iterator_delivers_exactly_the_rest_of_the_stream(tmp_path, distributed, eight_replica_strategy):
    """Element by element against the uninterrupted stream (built without iterators): one batch too
    far or too early is a missing or a repeated batch, which a training curve would never show."""
    files = write_small_shards(tmp_path / "data", 128, 2)[0]  # 4 batches (steps) of 32 an epoch, 3 epochs
    config = default_config("batched", files, 1, False).model_copy(update={"batch_size": 32})
    if distributed:
        strategy = eight_replica_strategy

        def read(step) -> dict[str, np.ndarray]:
            return {key: np.concatenate([part.numpy() for part in strategy.experimental_local_results(value)])
                    for key, value in step.items()}

        full = [read(step) for step in Pipeline.from_config(config).distribute(strategy)]
        make = lambda: Pipeline.from_config(config).distributed_iterator(strategy)  # noqa: E731
        positions = (0, 4, 9)  # the start, the next epoch's first step, mid epoch 2
    else:
        read = lambda batch: {key: value.numpy() for key, value in batch.items()}  # noqa: E731
        full = batches(Pipeline.from_config(config).build())
        make = lambda: Pipeline.from_config(config).iterator()  # noqa: E731
        positions = (0, 1, 3, 4, 11, 12)  # also an epoch's last batch, the last one, and after the end
    assert len(full) == 3 * 4 and sorted(int(i) for batch in full[:4] for i in batch["id"]) == list(range(128))
    for k, rest in restored_rests(make, positions, tmp_path, read).items():
        assert [b["id"].tolist() for b in rest[:1]] == [b["id"].tolist() for b in full[k:k + 1]], \
            f"restored after {k} batches: it does not go on with batch {k}"
        assert_same(rest, full[k:], f"restored after {k} batches")
