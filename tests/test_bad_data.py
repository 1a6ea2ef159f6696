"""Bad files and a wrong feature spec are one-line errors at build time, naming the file and key."""
from __future__ import annotations

import glob
import logging
import os

import pytest

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.pipeline import Pipeline

from helpers import small_config, write_small_shards

pytestmark = pytest.mark.tf_builds


@pytest.fixture
def shards(tmp_path):
    files, _ = write_small_shards(tmp_path / "data", 64, 4)
    return files


def pipeline_of(config: dict) -> Pipeline:
    return Pipeline.from_config(config_from_dict({"data": config}).data)


def build(config: dict):
    return pipeline_of(config).build()


def test_a_glob_that_matches_a_directory_names_it(shards, tmp_path):
    os.makedirs(tmp_path / "data" / "train-extra.tfrecord")
    with pytest.raises(DataError, match=r"matches the directory .*train-extra.tfrecord'; match files only"):
        build(small_config(shards))


def test_a_dangling_symlink_is_named_with_its_target(shards, tmp_path):
    os.symlink(tmp_path / "gone.tfrecord", tmp_path / "data" / "train-link.tfrecord")
    with pytest.raises(DataError, match=r"train-link.tfrecord' .* is a symbolic link to .*gone.tfrecord', which does not exist"):
        build(small_config(shards))


@pytest.fixture
def dataset_dir(tmp_path):
    from tpu_pipeline.records.demo_shapes import ensure_demo_dataset

    return ensure_demo_dataset(str(tmp_path / "demo"), num_train=64, num_eval=16, size=16, num_shards=4)


def dir_config(directory: str, **overrides) -> dict:
    config = {"source": {"type": "tfrecord", "dir": directory, "split": "train"},
              "preprocess": [{"op": "decode_image", "format": "jpeg"}, {"op": "resize", "size": 16}],
              "batch_size": 8, "repeat": 1}
    config.update(overrides)
    return config


def test_an_empty_shard_of_a_converted_dataset_is_an_error_naming_it(dataset_dir):
    shard = sorted(glob.glob(os.path.join(dataset_dir, "train-*")))[1]
    open(shard, "wb").close()
    with pytest.raises(DataError, match=rf"{shard}: metadata.json lists 16 record\(s\) in this file, but it is empty"):
        build(dir_config(dataset_dir))


def test_an_empty_shard_in_a_glob_is_reported(shards, caplog):
    open(sorted(glob.glob(shards))[2], "wb").close()
    with caplog.at_level(logging.WARNING):
        pipeline = pipeline_of(small_config(shards))
        assert pipeline.source.count_examples() == 48
    assert "1 of the 4 files matched by data.source.files hold no record" in caplog.text


@pytest.mark.parametrize("features, message", [
    ({"feature": {"dtype": "float32", "shape": [16]}},
     r"data.features.feature: record 0 of .*train-00000-of-00004.tfrecord has no feature 'feature' "
     r"\(it has: features, id, label\); rename the key"),
    ({"features": {"dtype": "float32", "shape": [16]}, "label": {"dtype": "float32"}},
     r"data.features.label: record 0 of .* stores int64 values where dtype is float32; set dtype: int64"),
    ({"features": {"dtype": "float32", "shape": [4, 3]}},
     r"data.features.features: record 0 of .* holds 16 value\(s\) where shape is \[4, 3\] \(12 value\(s\)\); "
     r"set shape: \[16\]"),
])
def test_a_feature_spec_that_does_not_fit_the_records_is_an_error_before_building(shards, features, message):
    config = small_config(shards, features=features, augment=[])
    with pytest.raises(ConfigError, match=message):
        pipeline_of(config)


def test_missing_features_with_a_default_or_var_kind_pass(shards):
    features = {"features": {"dtype": "float32", "shape": [16]}, "weight": {"dtype": "float32", "default": 1.0},
                "tags": {"dtype": "string", "kind": "var"}}
    pipeline_of(small_config(shards, features=features, augment=[]))


def test_records_that_are_not_examples_are_named(tmp_path):
    import tensorflow as tf

    path = str(tmp_path / "raw.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(b"\xff\xfe not a protocol buffer \x00\x01")
    with pytest.raises(DataError, match=r"raw.tfrecord: record 0 is not a tf.train.Example"):
        pipeline_of(small_config(path, augment=[]))


def example(index: int, image: bytes, label: int = 0, with_label: bool = True) -> bytes:
    import tensorflow as tf

    from tpu_pipeline.records.writer import bytes_feature, int_feature

    feature = {"image": bytes_feature(image), "id": int_feature(index)}
    if with_label:
        feature["label"] = int_feature(label)
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


@pytest.fixture
def planted(tmp_path):
    """Four shards with one planted fault of each kind; returns (glob, the faults verify must find)."""
    import tensorflow as tf

    from helpers import jpeg_examples

    good = list(jpeg_examples(48, size=8))
    directory = tmp_path / "planted"
    directory.mkdir()
    paths = [str(directory / f"part-{i}.tfrecord") for i in range(5)]
    for i, path in enumerate(paths[:3]):
        with tf.io.TFRecordWriter(path) as writer:
            for record in good[16 * i:16 * (i + 1)]:
                writer.write(record)
    jpeg = tf.io.encode_jpeg(tf.zeros([8, 8, 3], tf.uint8)).numpy()
    with tf.io.TFRecordWriter(paths[3]) as writer:
        writer.write(example(100, jpeg))
        writer.write(b"\x00\x01 not a protocol buffer \xff")   # record 1
        writer.write(example(102, b"not a jpeg at all"))      # record 2
        writer.write(example(103, jpeg, label=9))              # record 3: 4 classes
        writer.write(example(104, jpeg, with_label=False))     # record 4
        writer.write(example(105, jpeg))
    open(paths[4], "wb").close()
    raw = bytearray(open(paths[1], "rb").read())
    lengths, offset = [], 0
    while offset < len(raw):
        length = int.from_bytes(raw[offset:offset + 8], "little")
        lengths.append((offset, length))
        offset += 16 + length
    raw[lengths[3][0] + 12 + 5] ^= 0xFF  # a byte inside record 3's data: its CRC fails
    open(paths[1], "wb").write(bytes(raw))
    cut = open(paths[2], "rb").read()
    open(paths[2], "wb").write(cut[:len(cut) - 20])  # the last record loses its end
    expected = {
        (paths[1], 3, "bad_data_crc"), (paths[2], 15, "truncated"), (paths[3], 1, "not_an_example"),
        (paths[3], 2, "op_failed"), (paths[3], 3, "label_out_of_range"), (paths[3], 4, "missing_feature"),
        (paths[4], None, "empty_file"),
    }
    return str(directory / "part-*.tfrecord"), expected


def verify_config(files: str) -> dict:
    return {"source": {"type": "tfrecord", "files": files},
            "features": {"image": {"dtype": "string"}, "label": {"dtype": "int64"}, "id": {"dtype": "int64"}},
            "preprocess": [{"op": "decode_image", "format": "jpeg"}, {"op": "resize", "size": 8}],
            "augment": [{"op": "random_flip"}], "batch_size": 8, "outputs": {"inputs": "image", "targets": "label"}}


def test_verify_finds_every_planted_fault_and_nothing_else(planted):
    from tpu_pipeline.verify import verify_data

    files, expected = planted
    config = config_from_dict({"data": verify_config(files)}).data
    report = verify_data(config, num_classes=4, progress=False)
    assert {(f.file, f.record, f.kind) for f in report.faults} == expected
    assert report.files == 5 and report.records == 16 + 16 + 15 + 6
    crc = next(f for f in report.faults if f.kind == "bad_data_crc")
    assert crc.offset > 0 and "copy or convert the file again" in crc.fix
    op = next(f for f in report.faults if f.kind == "op_failed")
    assert op.what.startswith("data.preprocess[0] (decode_image) fails:")
    table = report.table()
    assert table.startswith("data: 53 records in 5 file(s): 7 fault(s) (bad_data_crc 1, empty_file 1, label_out_of_range 1")
    assert f"{files.replace('part-*', 'part-3')} | 3 | " in table


def test_verify_command_exits_1_and_writes_the_report(planted, tmp_path, capsys):
    import json

    import yaml

    from tpu_pipeline.cli import main

    files, expected = planted
    config_path = tmp_path / "c.yaml"
    config_path.write_text(yaml.safe_dump({"data": verify_config(files), "train": {"num_classes": 4}}))
    with pytest.raises(SystemExit) as exit_info:
        main(["tpu-pipeline", "verify", "--config", str(config_path), "--json", str(tmp_path / "r.json")])
    assert exit_info.value.code == 1
    report = json.load(open(tmp_path / "r.json"))
    assert report[0]["faults_by_kind"]["truncated"] == 1 and len(report[0]["faults"]) == len(expected)
    assert "7 fault(s)" in capsys.readouterr().out


@pytest.mark.parametrize("plant", ["bad_jpeg", "bad_crc"])
def test_training_on_a_damaged_record_stops_with_one_line_naming_it(tmp_path, plant):
    import tensorflow as tf

    from helpers import jpeg_examples
    from tpu_pipeline.train import train

    records = list(jpeg_examples(64, size=8))
    paths = [str(tmp_path / f"part-{i}.tfrecord") for i in range(2)]
    for i, path in enumerate(paths):
        with tf.io.TFRecordWriter(path) as writer:
            for index, record in enumerate(records[32 * i:32 * (i + 1)]):
                writer.write(example(1000, b"\xff\xd8 broken jpeg") if (plant, i, index) == ("bad_jpeg", 1, 5) else record)
    if plant == "bad_crc":
        raw = bytearray(open(paths[1], "rb").read())
        first_length = int.from_bytes(raw[:8], "little")
        raw[16 + first_length + 12 + 3] ^= 0xFF  # inside record 1's bytes
        open(paths[1], "wb").write(bytes(raw))
    data = verify_config(str(tmp_path / "part-*.tfrecord"))
    data.update(augment=[{"op": "cast", "key": "label", "dtype": "int32"}], repeat="forever", batch_size=16,
                shuffle={"enabled": False})
    config = config_from_dict({"data": data, "model": {"architecture": "mlp", "mlp": {"hidden_units": [4]}},
                               "train": {"run_dir": str(tmp_path / "run"), "epochs": 1, "num_classes": 4,
                                         "tensorboard": False}})
    with pytest.raises(DataError) as error:
        train(config, printer=lambda line: None)
    message = str(error.value)
    assert "\n" not in message
    if plant == "bad_jpeg":
        assert message.startswith(f"data: {paths[1]}, record 5 (byte ")
        assert "data.preprocess[0] (decode_image) fails" in message
        assert message.endswith("list every fault with: tpu-pipeline verify --config ...")
    else:  # found by the counting pass over a bare glob, before training
        assert message.startswith(f"{paths[1]}: corrupted record at {16 + first_length + 12} (bytes that are not TFRecord")


# Labels around the boundary of 4 classes: 3 is the last class; 4 (= num_classes, the off-by-one),
# -1 and 5 are not. Record index → its out-of-range label.
BOUNDARY_LABELS = [0, 3, 4, -1, 2, 5, 1]
OUT_OF_RANGE = {2: 4, 3: -1, 5: 5}


def write_labelled(path, labels) -> str:
    """One file of small records (16 floats, id i, label labels[i]): nothing but a label can be wrong."""
    import numpy as np
    import tensorflow as tf

    from helpers import small_examples

    with tf.io.TFRecordWriter(str(path)) as writer:
        for index, record in enumerate(small_examples(np.zeros((len(labels), 16), np.float32))):
            example = tf.train.Example.FromString(record)
            example.features.feature["label"].int64_list.value[:] = [labels[index]]
            writer.write(example.SerializeToString())
    return str(path)


def relabel(path: str, labels: dict) -> None:
    """Rewrites a TFRecord file in place with record i's label set to labels[i] (the count stays)."""
    import tensorflow as tf

    records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    with tf.io.TFRecordWriter(path) as writer:
        for index, record in enumerate(records):
            if index in labels:
                example = tf.train.Example.FromString(record)
                example.features.feature["label"].int64_list.value[:] = [labels[index]]
                record = example.SerializeToString()
            writer.write(record)


def test_verify_checks_labels_at_the_class_count_boundary(tmp_path):
    """Existing plants (9, 99) are far out of range: label == num_classes is the off-by-one that slips
    through `<=`, and -1 the one that slips through a missing lower bound; num_classes - 1 is fine."""
    from tpu_pipeline.verify import first_fault, verify_data

    path = write_labelled(tmp_path / "labels.tfrecord", BOUNDARY_LABELS)
    config = config_from_dict({"data": small_config(path)}).data
    report = verify_data(config, num_classes=4, progress=False)
    assert {(f.record, f.kind) for f in report.faults} == {(r, "label_out_of_range") for r in OUT_OF_RANGE}, report.table()
    assert {f.record: f.what for f in report.faults} == {
        record: f"label 'label' is {label}, outside 0..3" for record, label in OUT_OF_RANGE.items()}
    assert first_fault(config, num_classes=4).record == 2
    assert verify_data(config, num_classes=6, progress=False).faults[0].record == 3  # only -1 is outside 0..5


def test_verify_takes_the_class_count_from_a_converted_datasets_class_names(dataset_dir):
    """train.num_classes unset: metadata.json's 4 class names bound the labels (label 4 is a fault, 3 is not)."""
    from tpu_pipeline.format import read_metadata
    from tpu_pipeline.verify import verify_data

    assert len(read_metadata(dataset_dir)["class_names"]) == 4
    shard = sorted(glob.glob(os.path.join(dataset_dir, "train-*")))[1]
    relabel(shard, {1: 4, 2: 3})
    config = config_from_dict({"data": dir_config(dataset_dir)}).data
    report = verify_data(config, progress=False)
    assert [(os.path.basename(f.file), f.record, f.kind) for f in report.faults] == [
        (os.path.basename(shard), 1, "label_out_of_range")], report.table()
    assert report.faults[0].what == "label 'label' is 4, outside 0..3"
