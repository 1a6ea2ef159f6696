"""Empty or missing data is one line when the pipeline is built, never a stream that waits for ever; a
source switches between `files` and `dir` in one override; a stuck stream is located by stage.

Real files throughout: empty TFRecord files (0 bytes, and a GZIP one that holds no record in 20-odd bytes),
a converted dataset whose split lists no record, a mixture with an empty source. The CLI's side (a real
`train` child for each case, the stall watch and SIGTERM) is in test_empty_data_cli.py.
"""
from __future__ import annotations

import json
import re

import pytest
import tensorflow as tf

from helpers import small_config, write_small_shards
from tpu_pipeline.config import load_config
from tpu_pipeline.config.base import validate
from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.config.loader import apply_overrides, merge
from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.pipeline.runtime.stall_probe import where_stuck
from tpu_pipeline.pipeline.sources.tfrecord import TFRecordSource

pytestmark = pytest.mark.tf_builds


def build(config: dict, prefix: str = "data") -> Pipeline:
    return Pipeline.from_config(validate(DataConfig, config, prefix=prefix), prefix=prefix)


def empty_file(path, compression: str = "") -> str:
    tf.io.TFRecordWriter(str(path), options=compression or None).close()
    return str(path)


@pytest.fixture
def shards(tmp_path):
    return write_small_shards(tmp_path / "shards", 48, 4)[0]


def test_a_zero_byte_file_is_refused_in_one_line(tmp_path):
    path = empty_file(tmp_path / "empty.tfrecord")
    with pytest.raises(DataError) as raised:
        build(small_config(path))
    assert str(raised.value) == (
        f"data.source.files={path}: the file it matches holds no record ({path}: 0 bytes), so there is nothing to "
        "read; point data.source.files at TFRecord files that hold records, or write it again")


def test_files_that_all_hold_no_record_are_refused_whatever_their_size(tmp_path):
    # A GZIP file with no record is not 0 bytes: the check reads, it does not stat.
    for index in range(3):
        empty_file(tmp_path / f"part-{index}.tfrecord.gz", "GZIP")
    pattern = str(tmp_path / "part-*.tfrecord.gz")
    with pytest.raises(DataError, match=rf"data.source.files={re.escape(pattern)}: all 3 files it matches hold no "
                                        rf"record \(.*part-0.tfrecord.gz: \d\d bytes\)"):
        build(small_config(pattern, source={"type": "tfrecord", "files": pattern, "compression": "GZIP"}))


def test_one_empty_file_beside_files_with_records_is_read(shards, tmp_path):
    path = empty_file(tmp_path / "shards" / "train-empty.tfrecord")
    pipeline = build(small_config([shards, path]))
    assert pipeline.source.count_examples() == 48  # the empty one is counted (and logged), not refused


@pytest.mark.parametrize("files", [[], "", " , "])
def test_an_empty_list_of_files_is_refused_by_the_config(files):
    with pytest.raises(ConfigError, match=r"data.source.files is empty .*: there is nothing to read; give a glob of "
                                          r"TFRecord files, e.g. data.source.files=gs://bucket/train-\*.tfrecord"):
        load_config(None, [], base={"data": small_config("x.tfrecord", source={"type": "tfrecord", "files": files})})


@pytest.mark.parametrize("files", [[], "", " , "])
def test_a_python_source_with_an_empty_list_of_files_is_one_line(files) -> None:
    """`Pipeline.from_config(cfg, source=TFRecordSource(files=[]))` passes no config check: it must still end in
    the one-line DataError that says the list is empty, never an IndexError from the first file of none."""
    config = validate(DataConfig, small_config("unused.tfrecord"), prefix="data")
    with pytest.raises(DataError) as raised:
        Pipeline.from_config(config, source=TFRecordSource(files=files))
    shown = files if isinstance(files, str) else ""
    assert str(raised.value) == (f"data.source.files: {shown!r} lists no file, so there is nothing to read; give "
                                 "TFRecord files that hold records")


def converted_with_an_empty_split(tmp_path, shards) -> str:
    """A converted dataset whose 'validation' split lists no record (its shards are empty), beside a train split."""
    directory = tmp_path / "converted"
    directory.mkdir()
    names = []
    for index, path in enumerate(sorted(tf.io.gfile.glob(shards))):
        names.append(f"train-{index:05d}-of-00004.tfrecord")
        tf.io.gfile.copy(path, str(directory / names[-1]))
    for index in range(2):
        empty_file(directory / f"validation-{index:05d}-of-00002.tfrecord")
    metadata = {
        "features": {"features": {"dtype": "float32", "shape": [16]}, "label": {"dtype": "int64"}, "id": {"dtype": "int64"}},
        "splits": {"train": {"files": names, "counts": [12] * 4, "num_examples": 48},
                   "validation": {"files": [f"validation-{i:05d}-of-00002.tfrecord" for i in range(2)],
                                  "counts": [0, 0], "num_examples": 0}},
    }
    (directory / "metadata.json").write_text(json.dumps(metadata))
    return str(directory)


def test_a_split_with_no_record_is_refused_naming_the_splits_that_have_some(tmp_path, shards):
    directory = converted_with_an_empty_split(tmp_path, shards)
    config = small_config("", source={"type": "tfrecord", "dir": directory, "split": "validation"}, features={})
    with pytest.raises(DataError) as raised:
        build(config, prefix="eval_data")
    assert str(raised.value) == (
        f"eval_data.source.split=validation: {directory}'s metadata.json lists no record in split 'validation' (its "
        "splits: train 48, validation 0), so there is nothing to read; choose a split that holds records "
        "(eval_data.source.split=train), or convert the data again")
    config["source"]["split"] = "train"
    assert build(config).source.count_examples() == 48


def mixture_config(first: str, second: str, weight: float = 1.0) -> dict:
    config = small_config(first)
    del config["source"]
    config["repeat"] = "forever"
    config["mixture"] = {"sources": [
        {"name": "web", "weight": 1.0, "source": {"type": "tfrecord", "files": first}},
        {"name": "code", "weight": weight, "source": {"type": "tfrecord", "files": second}},
    ]}
    return config


def test_a_mixture_source_with_no_record_is_refused_by_name(shards, tmp_path):
    path = empty_file(tmp_path / "code.tfrecord")
    with pytest.raises(DataError) as raised:
        build(mixture_config(shards, path))
    assert str(raised.value) == (
        f"data.mixture.sources[1] (code): data.mixture.sources.1.source.files={path}: the file it matches holds no "
        f"record ({path}: 0 bytes), so there is nothing to read; point data.mixture.sources.1.source.files at "
        "TFRecord files that hold records, or write it again, or remove this source from data.mixture.sources")
    build(mixture_config(shards, path, weight=0.0))  # weight 0 leaves it out: it may be empty


# --- data.source: files ↔ dir in one override ---------------------------------------------------------


DIR_SOURCE = {"data": {"source": {"type": "tfrecord", "dir": "/data/converted", "split": "train", "cycle_length": 4},
                       "batch_size": 8}}


def test_an_override_of_files_replaces_a_files_dir_and_split():
    raw = apply_overrides(DIR_SOURCE, ["data.source.files=/data/train-*.tfrecord"])
    assert raw["data"]["source"] == {"type": "tfrecord", "files": "/data/train-*.tfrecord", "cycle_length": 4}
    back = apply_overrides(raw, ["data.source.dir=/data/other"])
    assert back["data"]["source"] == {"type": "tfrecord", "dir": "/data/other", "cycle_length": 4}
    layered = merge(DIR_SOURCE, {"data": {"source": {"files": "/data/train-*.tfrecord"}}})  # a file over another
    assert layered["data"]["source"] == raw["data"]["source"]
    mixture = {"data": {"mixture": {"sources": [{"name": "a", "weight": 1, "source": {"dir": "/d", "split": "train"}}]}}}
    switched = apply_overrides(mixture, ["data.mixture.sources.0.source.files=/f/*.tfrecord"])
    assert switched["data"]["mixture"]["sources"][0]["source"] == {"files": "/f/*.tfrecord"}


def test_both_set_in_one_layer_is_refused_with_the_overrides_to_type():
    with pytest.raises(ConfigError) as raised:
        load_config(None, ["data.source.dir=/d", "data.source.files=/f/*.tfrecord"], base=DIR_SOURCE)
    assert str(raised.value).endswith(
        "both are set: to read the files, end the overrides with data.source.dir=null data.source.split=null; to "
        "read the directory, with data.source.files=null")
    with pytest.raises(ConfigError, match=r"data.source.split: only with data.source.dir .*; remove it: "
                                          r"data.source.split=null$"):
        load_config(None, ["data.source.split=validation", "data.source.files=/f/*.tfrecord"], base=DIR_SOURCE)


# --- where a stream that yields nothing is stuck ------------------------------------------------------


def test_an_input_pipeline_whose_share_of_the_files_is_empty_is_located_at_the_source(shards, tmp_path):
    # Whole files per input pipeline: the second pipeline's only file holds no record, so its epochs are empty.
    directory = tmp_path / "two"
    directory.mkdir()
    tf.io.gfile.copy(sorted(tf.io.gfile.glob(shards))[0], str(directory / "a.tfrecord"))
    empty_file(directory / "b.tfrecord")
    pattern = str(directory / "*.tfrecord")
    pipeline = build(small_config(pattern, source={"type": "tfrecord", "files": pattern, "sharding": "file",
                                                   "shuffle_files": False}, repeat="forever"))
    second = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=2)
    assert where_stuck(pipeline, second, seconds=60) == (
        f"at the source, data.source.files={pattern}: it yields no record for input pipeline 1 of 2 (its share of "
        "the files holds none); check the files with `tpu-pipeline verify`")
    first = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0, num_replicas_in_sync=2)
    assert where_stuck(pipeline, first, seconds=60).startswith("somewhere after its first elements")


def test_a_stream_through_the_service_is_located_at_the_service(shards):
    config = small_config(shards, repeat="forever", service={"address": "grpc://10.0.0.2:5050", "job_name": "run-1"})
    assert where_stuck(build(config)) == (
        "at the tf.data service grpc://10.0.0.2:5050 (distributed_epoch, job run-1): its workers made no batch; "
        "check that `tpu-pipeline serve worker` processes run and reach that dispatcher")
