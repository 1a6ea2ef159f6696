"""A damaged record met at run time outside `train` is one DataError line naming the file, the record
and the fix: in a plain loop over `build()` or `model.fit` on a distributed dataset inside
`Pipeline.naming_data_errors()`, and through `iterator()` / `distributed_iterator()` by themselves.

Real parts only: TFRecord shards of real JPEGs in a converted dataset directory (metadata.json lists
the counts, so a bad CRC is met while reading, not by a counting pass), one fault planted in record 5
of the second shard (not its first record: the build-time spec check reads only a first record).
"""
from __future__ import annotations

import gc
import itertools
import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import DataError
from tpu_pipeline.format.metadata import shard_name, write_metadata
from tpu_pipeline.pipeline import ArraySource, Batch, Pipeline
from tpu_pipeline.records.writer import bytes_feature, int_feature

from helpers import jpeg_examples

pytestmark = pytest.mark.tf_builds

SHARDS, PER_SHARD, BAD_SHARD, BAD_RECORD = 2, 16, 1, 5
GLOBAL_BATCH = 8  # one example per replica of the 8-replica strategy
FIXES = {
    "bad_jpeg": "data.preprocess[0] (decode_image) fails",
    "bad_crc": "the record's bytes are corrupted: copy or convert the file again",
    "missing_feature": "has no feature 'label' (it has: id, image); rename the key",
}
TF_SAID = {"bad_jpeg": "jpeg::Uncompress failed", "bad_crc": "corrupted record at", "missing_feature": "label"}


def _example(index: int, image: bytes, with_label: bool = True) -> bytes:
    feature = {"image": bytes_feature(image), "id": int_feature(index)}
    if with_label:
        feature["label"] = int_feature(index % 4)
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_dataset(directory: str, plant: str) -> str:
    """SHARDS shards of PER_SHARD real JPEG records and their metadata.json; returns the damaged shard's path."""
    os.makedirs(directory)
    records = list(jpeg_examples(SHARDS * PER_SHARD, size=8))
    names = [shard_name("train", i, SHARDS) for i in range(SHARDS)]
    for shard, name in enumerate(names):
        with tf.io.TFRecordWriter(os.path.join(directory, name)) as writer:
            for index in range(PER_SHARD):
                record = records[shard * PER_SHARD + index]
                if (shard, index) == (BAD_SHARD, BAD_RECORD):
                    jpeg = tf.train.Example.FromString(record).features.feature["image"].bytes_list.value[0]
                    if plant == "bad_jpeg":  # a real JPEG cut in half: an interrupted download
                        record = _example(1000, jpeg[:len(jpeg) // 2])
                    elif plant == "missing_feature":
                        record = _example(1000, jpeg, with_label=False)
                writer.write(record)
    damaged = os.path.join(directory, names[BAD_SHARD])
    if plant == "bad_crc":
        raw = bytearray(open(damaged, "rb").read())
        offset = 0
        for _ in range(BAD_RECORD):  # to record BAD_RECORD's header: 8 length + 4 CRC + data + 4 CRC each
            offset += 16 + int.from_bytes(raw[offset:offset + 8], "little")
        raw[offset + 12 + 3] ^= 0xFF  # a byte of its data: the data CRC fails, the size stays
        open(damaged, "wb").write(bytes(raw))
    write_metadata(directory, {
        "name": "planted", "class_names": ["a", "b", "c", "d"],
        "features": {"image": {"dtype": "string"}, "label": {"dtype": "int64"}, "id": {"dtype": "int64"}},
        "splits": {"train": {"files": names, "counts": [PER_SHARD] * SHARDS, "num_examples": SHARDS * PER_SHARD}},
    })
    return damaged


def pipeline_of(directory: str) -> Pipeline:
    data = {"source": {"type": "tfrecord", "dir": directory, "split": "train"},
            "preprocess": [{"op": "decode_image", "format": "jpeg"}, {"op": "resize", "size": 8},
                           {"op": "cast", "key": "label", "dtype": "int32"}],
            "shuffle": {"enabled": False}, "repeat": 1, "batch_size": GLOBAL_BATCH,
            "outputs": {"inputs": "image", "targets": "label"}}
    return Pipeline.from_config(config_from_dict({"data": data}).data)


@pytest.fixture(params=sorted(FIXES))
def damaged(request, tmp_path):
    """(the pipeline, the damaged shard's path, what was planted)."""
    path = write_dataset(str(tmp_path / "planted"), request.param)
    return pipeline_of(str(tmp_path / "planted")), path, request.param


def assert_named(error: BaseException, path: str, plant: str) -> None:
    assert type(error) is DataError
    message = str(error)
    assert "\n" not in message, message
    assert message.startswith(f"data: {path}, record {BAD_RECORD} (byte "), message
    assert os.path.basename(path) in message
    assert FIXES[plant] in message, message
    assert "(TensorFlow said: " in message and TF_SAID[plant] in message.split("(TensorFlow said: ")[1], message
    assert message.endswith("list every fault with: tpu-pipeline verify --config ..."), message
    assert error.__suppress_context__ and error.__cause__ is None  # raised `from None`: no TF trace above it


def test_a_plain_loop_over_build_names_the_record(damaged):
    pipeline, path, plant = damaged
    with pytest.raises(DataError) as caught:
        with pipeline.naming_data_errors():
            for _ in pipeline.build():
                pass
    assert_named(caught.value, path, plant)


def test_the_pipeline_iterator_names_the_record(damaged):
    pipeline, path, plant = damaged
    iterator = pipeline.iterator()
    with pytest.raises(DataError) as caught:
        for _ in iterator:
            pass
    assert_named(caught.value, path, plant)
    assert int(iterator.position.numpy()) < SHARDS * PER_SHARD // GLOBAL_BATCH  # it stopped short of the end


def test_the_distributed_iterator_names_the_record(damaged, eight_replica_strategy):
    pipeline, path, plant = damaged
    iterator = pipeline.distributed_iterator(eight_replica_strategy)
    with pytest.raises(DataError) as caught:
        for _ in itertools.islice(iterator, SHARDS * PER_SHARD // GLOBAL_BATCH):
            pass
    assert_named(caught.value, path, plant)


def test_model_fit_on_the_distributed_dataset_names_the_record(damaged, eight_replica_strategy):
    from tpu_pipeline.model import tf_keras

    pipeline, path, plant = damaged
    with eight_replica_strategy.scope():
        model = tf_keras.Sequential([tf_keras.layers.Input((8, 8, 3)), tf_keras.layers.Flatten(),
                                     tf_keras.layers.Dense(4)])
        model.compile(optimizer="sgd", loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(DataError) as caught:
        with pipeline.naming_data_errors():
            model.fit(pipeline.distribute(eight_replica_strategy), epochs=1,
                      steps_per_epoch=SHARDS * PER_SHARD // GLOBAL_BATCH, verbose=0)
    assert_named(caught.value, path, plant)
    del caught, model
    gc.collect()  # the failed step's iterators and functions go now, not in the middle of the next test


def test_other_errors_pass_through_unchanged(tmp_path):
    write_dataset(str(tmp_path / "sound"), "none")
    pipeline = pipeline_of(str(tmp_path / "sound"))
    assert sum(1 for _ in pipeline.iterator()) == SHARDS * PER_SHARD // GLOBAL_BATCH  # sound data: no error
    mistake = ValueError("a bug in the user's loop")
    with pytest.raises(ValueError) as caught:
        with pipeline.naming_data_errors():
            raise mistake
    assert caught.value is mistake
    # A TF data error the scan finds no fault for is not the data's: it goes on as it was.
    not_the_data = tf.errors.InvalidArgumentError(None, None, "logits and labels must have the same shape")
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        with pipeline.naming_data_errors():
            raise not_the_data
    assert caught.value is not_the_data


def test_a_pipeline_without_a_config_re_raises_the_original_error():
    pipeline = Pipeline(source=ArraySource({"x": np.array([[1.0], [2.0]], np.float32)}), stages=[Batch(2)])
    error = tf.errors.DataLossError(None, None, "corrupted record at 12")
    with pytest.raises(tf.errors.DataLossError) as caught:
        with pipeline.naming_data_errors():
            raise error
    assert caught.value is error
    bad = Pipeline(source=ArraySource({"x": np.array(["not a number"])}),
                   stages=[Batch(1)]).build().map(lambda b: tf.strings.to_number(b["x"]))
    with pytest.raises(tf.errors.InvalidArgumentError):
        with pipeline.naming_data_errors():
            next(iter(bad))


def test_a_split_the_dataset_lacks_is_named_by_the_section_that_asks_for_it(tmp_path):
    """A hub dataset converted with train/test splits, read by a config whose eval_data asks for `validation`: the
    line names eval_data.source.split (not data.source.split) and the likeliest split to set instead."""
    from tpu_pipeline.records import ensure_demo_dataset

    directory = ensure_demo_dataset(str(tmp_path / "demo"), num_train=16, num_eval=8, size=16, num_shards=2)
    source = {"type": "tfrecord", "dir": directory}
    features = {"image": {"dtype": "string"}, "label": {"dtype": "int64"}}
    data = {"source": {**source, "split": "test"}, "features": features, "batch_size": 4}
    with pytest.raises(DataError) as raised:
        Pipeline.from_config(config_from_dict({"data": data}).data, prefix="eval_data")
    assert str(raised.value) == (f"eval_data.source.split=test: {directory!r} has no split 'test'; its splits: "
                                 "['train', 'validation']; set eval_data.source.split=validation (or train)")
    with pytest.raises(DataError, match=r"^data.source.split=test: .* set data.source.split=train \(or validation\)$"):
        Pipeline.from_config(config_from_dict({"data": data}).data)
    mixture = {"sources": [{"name": "a", "weight": 1, "source": {**source, "split": "train"}},
                           {"name": "b", "weight": 1, "source": {**source, "split": "dev"}}]}
    with pytest.raises(DataError, match=r"^data.mixture.sources\[1\].source.split=dev: "):
        Pipeline.from_config(config_from_dict({"data": {"mixture": mixture, "features": features, "batch_size": 4,
                                                        "repeat": "forever"}}).data)
