"""`data.on_error: skip` on real files with planted faults: exactly the good records (by id), each
once, exact counts by kind and file, in per-example and batch-then-parse pipelines, with and without
the record cache, on one and two input pipelines; `max_skipped`; the cached check; training."""
from __future__ import annotations

import collections
import json
import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import DataError
from tpu_pipeline.pipeline import Pipeline

from helpers import small_examples
from test_bad_data import dataset_dir, planted, verify_config  # noqa: F401 (fixtures)

pytestmark = pytest.mark.tf_builds


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_PIPELINE_CACHE", str(tmp_path / "cache"))


def pipeline_of(data: dict, num_classes=None) -> Pipeline:
    return Pipeline.from_config(config_from_dict({"data": data}).data, num_classes=num_classes)


def ids_of_epoch(pipeline: Pipeline, context=None) -> list[int]:
    ids = []
    for batch in pipeline.build(context):
        ids.extend(int(i) for i in batch["id"].numpy())
    return ids


def test_per_example_jpegs_skip_exactly_the_planted_faults(planted):  # noqa: F811
    files, _ = planted
    data = verify_config(files)
    data.update(on_error="skip", max_skipped=10, batch_size=4, drop_remainder=False, repeat=1, augment=[], outputs=None,
                shuffle={"enabled": False})
    pipeline = pipeline_of(data, num_classes=4)
    good = set(range(16)) | (set(range(16, 32)) - {19}) | set(range(32, 47)) | {100, 105}
    ids = ids_of_epoch(pipeline)
    assert sorted(ids) == sorted(good) and len(ids) == len(set(ids))
    report = pipeline.skipped
    assert report.by_kind() == {"bad_data_crc": 1, "empty_file": 1, "label_out_of_range": 1, "missing_feature": 1,
                                "not_an_example": 1, "op_failed": 1, "truncated": 1}
    assert report.skipped == 6 and report.total == len(good) + 6
    assert report.by_file() == {files.replace("*", "1"): 1, files.replace("*", "2"): 1, files.replace("*", "3"): 4}
    assert pipeline.source.count_examples() == len(good)


def write_small_faulty(directory) -> tuple[str, set[int]]:
    """3 shards of 200 small records (ids 0..599); shard 0: record 60 has 12 values for a [16] feature,
    record 61 a float label; shard 1: record 7 is not an Example, record 50 has label 99, record 120
    lacks `features`; shard 2: a bad data CRC at record 30 and a truncated end."""
    os.makedirs(directory, exist_ok=True)
    values = np.random.default_rng(0).normal(size=(600, 16)).astype(np.float32)
    records = list(small_examples(values))
    bad = {60, 61, 200 + 7, 200 + 50, 200 + 120, 400 + 30, 599}
    for shard in range(3):
        with tf.io.TFRecordWriter(os.path.join(directory, f"train-{shard}.tfrecord")) as writer:
            for index in range(200 * shard, 200 * (shard + 1)):
                record = records[index]
                if index == 207:
                    record = b"\x07 not a protocol buffer"
                elif index in (60, 61, 250, 320):
                    example = tf.train.Example.FromString(record)
                    feature = example.features.feature
                    if index == 60:
                        del feature["features"].float_list.value[12:]
                    elif index == 61:
                        feature["label"].Clear()
                        feature["label"].float_list.value.append(1.0)
                    elif index == 250:
                        feature["label"].int64_list.value[:] = [99]
                    else:
                        del feature["features"]
                    record = example.SerializeToString()
                writer.write(record)
    path = os.path.join(directory, "train-2.tfrecord")
    raw = bytearray(open(path, "rb").read())
    offset = 0
    for _ in range(30):
        offset += 16 + int.from_bytes(raw[offset:offset + 8], "little")
    raw[offset + 12 + 4] ^= 0xFF
    open(path, "wb").write(bytes(raw[:-10]))
    return os.path.join(directory, "train-*.tfrecord"), set(range(600)) - bad


def small_data(files: str, **overrides) -> dict:
    data = {"source": {"type": "tfrecord", "files": files},
            "features": {"features": {"dtype": "float32", "shape": [16]}, "label": {"dtype": "int64"},
                         "id": {"dtype": "int64"}},
            "augment": [{"op": "cast", "key": "id", "dtype": "int32"}],
            "batch_size": 32, "drop_remainder": False, "repeat": 1, "seed": 5,
            "outputs": None, "on_error": "skip", "max_skipped": 0.02}
    data.update(overrides)
    return data


@pytest.mark.parametrize("records", [False, True], ids=["no_record_cache", "record_cache"])
@pytest.mark.parametrize("parse", ["batched", "per_example"])
def test_small_records_skip_exactly_the_bad_ones_in_both_parse_modes(tmp_path, parse, records):
    files, good = write_small_faulty(tmp_path / "data")
    data = small_data(files, parse=parse, cache={"records": records}, repeat=2,
                      shuffle={"buffer_size": 128})
    pipeline = pipeline_of(data, num_classes=10)
    assert pipeline.plan.parse.value == parse and pipeline.plan.record_cache.value == records
    ids = ids_of_epoch(pipeline)
    epochs = [ids[:len(good)], ids[len(good):]]
    assert len(ids) == 2 * len(good)
    for epoch in epochs:
        assert sorted(epoch) == sorted(good)  # each good record once, no bad one
    assert epochs[0] != epochs[1]  # still reshuffled per epoch
    assert pipeline.skipped.by_kind() == {"bad_data_crc": 1, "label_out_of_range": 1, "missing_feature": 1,
                                          "not_an_example": 1, "truncated": 1, "wrong_dtype": 1, "wrong_shape": 1}
    assert pipeline.skipped.skipped == 7


def test_two_input_pipelines_split_the_good_records_exactly(tmp_path):
    files, good = write_small_faulty(tmp_path / "data")
    pipeline = pipeline_of(small_data(files), num_classes=10)
    parts = [ids_of_epoch(pipeline, tf.distribute.InputContext(2, index, 2)) for index in range(2)]
    assert len(parts[0]) == len(parts[1]) == len(good) // 2
    assert not set(parts[0]) & set(parts[1]) and set(parts[0]) | set(parts[1]) <= good


def test_more_bad_records_than_max_skipped_is_an_error_naming_the_first(tmp_path):
    files, _ = write_small_faulty(tmp_path / "data")
    with pytest.raises(DataError, match=r"data.max_skipped=3: 7 of 600 records are bad \(1.2%\), more than the 3 "
                                        r"allowed; the first: .*train-0.tfrecord, record 60 \(byte [\d,]+\): feature 'features' holds 12 value"):
        pipeline_of(small_data(files, max_skipped=3), num_classes=10)


def test_the_check_runs_once_per_file_contents_and_each_fault_is_logged(tmp_path, caplog):
    files, good = write_small_faulty(tmp_path / "data")
    with caplog.at_level(logging.INFO, logger="absl"):
        pipeline_of(small_data(files), num_classes=10)
    assert "checking every record of 3 file(s) once" in caplog.text
    assert caplog.text.count("leaving out") == 7
    assert "7 of 600 records left out in 3 file(s)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="absl"):
        again = pipeline_of(small_data(files), num_classes=10)
    assert "checking every record" not in caplog.text and again.skipped.skipped == 7
    assert sorted(ids_of_epoch(again)) == sorted(good)
    with open(files.replace("*", "0"), "ab") as handle:  # a changed file is checked again
        handle.write(b"")
    os.utime(files.replace("*", "0"), (1, 1))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="absl"):
        pipeline_of(small_data(files), num_classes=10)
    assert "checking every record of 3 file(s) once" in caplog.text


def test_clean_data_reads_the_original_files(tmp_path):
    from helpers import write_small_shards

    files, _ = write_small_shards(tmp_path / "data", 64, 2)
    pipeline = pipeline_of(small_data(files), num_classes=10)
    assert pipeline.skipped.skipped == 0 and pipeline.skipped.faults == []
    assert all(str(tmp_path / "data") in path for path in pipeline.source.tfrecord_files())


def test_training_reports_what_it_skipped_in_metrics_json(tmp_path):
    from tpu_pipeline.train import train

    files, good = write_small_faulty(tmp_path / "data")
    data = small_data(files, augment=[{"op": "cast", "key": "label", "dtype": "int32"}], repeat="forever",
                      batch_size=64, outputs={"inputs": "features", "targets": "label"})
    config = config_from_dict({"data": data, "model": {"architecture": "mlp", "mlp": {"hidden_units": [4]}},
                               "train": {"run_dir": str(tmp_path / "run"), "epochs": 1, "num_classes": 10,
                                         "tensorboard": False}})
    metrics = train(config, printer=lambda line: None)
    assert metrics["steps_per_epoch"] == len(good) // 64
    saved = json.load(open(tmp_path / "run" / "metrics.json"))
    assert saved["skipped"]["data"]["skipped"] == 7 and saved["skipped"]["data"]["records"] == 600
    assert collections.Counter(saved["skipped"]["data"]["faults_by_kind"]).total() == 7


def test_a_resume_continues_exactly_over_the_good_records(tmp_path):
    files, good = write_small_faulty(tmp_path / "data")
    pipeline = pipeline_of(small_data(files, repeat=2, shuffle={"buffer_size": 128}), num_classes=10)
    full = ids_of_epoch(pipeline)
    resumed = []
    for batch in pipeline.build(start=7 * 32):
        resumed.extend(int(i) for i in batch["id"].numpy())
    assert resumed == full[7 * 32:]


def test_skip_leaves_out_labels_at_and_beyond_the_class_count_and_keeps_the_last_class(tmp_path):
    """The same boundary as verify's: label == num_classes and -1 are left out, num_classes - 1 stays."""
    from test_bad_data import BOUNDARY_LABELS, OUT_OF_RANGE, write_labelled

    path = write_labelled(tmp_path / "labels.tfrecord", BOUNDARY_LABELS)
    pipeline = pipeline_of(small_data(path, max_skipped=10, shuffle={"enabled": False}), num_classes=4)
    assert sorted(ids_of_epoch(pipeline)) == [i for i in range(len(BOUNDARY_LABELS)) if i not in OUT_OF_RANGE]
    assert sorted(f.record for f in pipeline.skipped.faults) == sorted(OUT_OF_RANGE)
    assert pipeline.skipped.by_kind() == {"label_out_of_range": 3}


def test_skip_takes_the_class_count_from_a_converted_datasets_class_names(dataset_dir):  # noqa: F811
    """Pipeline.from_config without num_classes (train.num_classes unset): metadata.json's class names count."""
    import glob

    from test_bad_data import dir_config, relabel

    shard = sorted(glob.glob(os.path.join(dataset_dir, "train-*")))[1]
    relabel(shard, {1: 4, 2: 3})
    data = dir_config(dataset_dir, on_error="skip", max_skipped=1, shuffle={"enabled": False}, drop_remainder=False)
    pipeline = pipeline_of(data)
    assert pipeline.skipped.by_kind() == {"label_out_of_range": 1}
    assert pipeline.source.count_examples() == 63
