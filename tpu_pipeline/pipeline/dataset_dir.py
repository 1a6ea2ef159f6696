"""Reading a directory written by `tpu-pipeline convert` (or the demo): its metadata.json gives the
exact shard list, the feature spec, the example count and the class names, so a config needs only
`source: {type: tfrecord, dir: ..., split: train}`.

`dataset_info(config)` answers "how many examples, which classes" for any source, so the training
layer can compute steps_per_epoch and num_classes without reading the data.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from tpu_pipeline.config.data import (
    ArraySourceConfig, DataConfig, FeatureConfig, TFDSSourceConfig, TFRecordSourceConfig,
)
from tpu_pipeline.errors import DataError
from tpu_pipeline.pipeline.sources import TFRecordSource
from tpu_pipeline.records.writer import METADATA_FILE, read_metadata
from tpu_pipeline.system import local_path

DEFAULT_SPLIT = "train"


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What is known before reading: None where the source cannot tell (e.g. a bare glob)."""

    num_examples: Optional[int]
    class_names: Optional[list[str]]
    features: dict[str, Any]

    @property
    def num_classes(self) -> Optional[int]:
        return len(self.class_names) if self.class_names else None


def read_dataset_metadata(directory: str, key: str = "data.source") -> dict[str, Any]:
    """metadata.json of a finished dataset directory; a DataError naming the fix otherwise."""
    directory = local_path(directory)
    metadata = read_metadata(directory)
    if metadata is not None:
        return metadata
    if tf.io.gfile.isdir(directory):
        raise DataError(
            f"{key}.dir: {directory!r} has no {METADATA_FILE}, so its conversion did not finish (or it was not "
            "written by `tpu-pipeline convert`); run the same convert command again to finish it"
        )
    raise DataError(f"{key}.dir: {directory!r} does not exist; give the --out directory of `tpu-pipeline convert`")


def load_dataset_dir(directory: str, split: Optional[str] = None, key: str = "data.source") -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, the split's entry: files, counts, num_examples) of a finished dataset directory."""
    metadata = read_dataset_metadata(directory, key)
    split = split or DEFAULT_SPLIT
    splits = metadata.get("splits") or {}
    if split not in splits:
        raise DataError(f"{key}.split: {directory!r} has no split {split!r}; its splits: {sorted(splits)}")
    return metadata, splits[split]


def dir_features(directory: str, key: str = "data.source") -> dict[str, FeatureConfig]:
    """The metadata's feature spec as config objects (what `data.features` would hold)."""
    features = read_dataset_metadata(directory, key).get("features") or {}
    if not features:
        raise DataError(f"{key}.dir: {directory!r}: {METADATA_FILE} has no feature spec; set data.features")
    return {name: FeatureConfig(**entry) for name, entry in features.items()}


@dataclasses.dataclass(frozen=True)
class DatasetDirSource:
    """A TFRecordSource over the shards metadata.json lists, with its exact cardinality when unsharded."""

    dir: str
    split: str = DEFAULT_SPLIT
    shuffle_files: bool = True
    file_seed: int = 0
    sharding: str = "auto"
    cycle_length: Any = 16
    block_length: int = 1
    num_parallel_calls: Any = "autotune"
    deterministic: Optional[bool] = None
    buffer_size: Any = "auto"
    record_batch: int = 0
    keep_blocks: bool = False
    cache_records: bool = False

    @property
    def compression(self) -> str:
        return read_dataset_metadata(self.dir).get("compression", "")

    def tfrecord_files(self) -> list[str]:
        return list(self.tfrecord_source()[0].files)

    def tfrecord_source(self) -> tuple[TFRecordSource, int]:
        metadata, entry = load_dataset_dir(self.dir, self.split)
        directory = local_path(self.dir)
        files = [tf.io.gfile.join(directory, name) for name in entry["files"]]
        source = TFRecordSource(
            files=files, compression=metadata.get("compression", ""), shuffle_files=self.shuffle_files,
            file_seed=self.file_seed, sharding=self.sharding, cycle_length=self.cycle_length,
            block_length=self.block_length, num_parallel_calls=self.num_parallel_calls,
            deterministic=self.deterministic, buffer_size=self.buffer_size, record_batch=self.record_batch,
            keep_blocks=self.keep_blocks, cache_records=self.cache_records,
        )
        return source, int(entry["num_examples"])

    def build(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
        source, num_examples = self.tfrecord_source()
        dataset = source.build(context)
        blocks = self.record_batch and self.keep_blocks  # then elements are blocks, not examples
        if (context.num_input_pipelines <= 1 or self.sharding == "off") and not blocks:
            # Every record once: tell tf.data (and Keras) the epoch length, and fail loudly if it is wrong.
            dataset = dataset.apply(tf.data.experimental.assert_cardinality(num_examples))
        return dataset


def dataset_info(config: DataConfig) -> DatasetInfo:
    """Example count (all input pipelines together), class names and features of a config's source."""
    source = config.source
    if isinstance(source, TFRecordSourceConfig):
        if source.dir is None:
            return DatasetInfo(None, None, dict(config.features))
        metadata, entry = load_dataset_dir(source.dir, source.split)
        features = dict(config.features) or dir_features(source.dir)
        return DatasetInfo(int(entry["num_examples"]), metadata.get("class_names"), features)
    if isinstance(source, TFDSSourceConfig):
        from tpu_pipeline.pipeline.tfds_source import tfds_info  # noqa: PLC0415 (imports TFDS)

        return tfds_info(source)
    assert isinstance(source, ArraySourceConfig)
    path = local_path(source.path)
    if not tf.io.gfile.exists(path):
        raise DataError(f"data.source.path: {path!r} does not exist")
    with tf.io.gfile.GFile(path, "rb") as handle:
        loaded = np.load(handle)
        shapes = {key: loaded[key].shape for key in loaded.files}
    lengths = {shape[0] for shape in shapes.values() if shape}
    return DatasetInfo(lengths.pop() if len(lengths) == 1 else None, None, {k: list(s[1:]) for k, s in shapes.items()})
