"""Reading a directory written by `tpu-pipeline convert` (or the demo): its metadata.json gives the
exact shard list, the feature spec, the example count and the class names, so a config needs only
`source: {type: tfrecord, dir: ..., split: train}`.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import tensorflow as tf

from tpu_pipeline.format import DEFAULT_SPLIT, DatasetInfo, dir_features, load_dataset_dir, read_dataset_metadata
from tpu_pipeline.pipeline.source import ReadOptions, RecordFileSource
from tpu_pipeline.pipeline.sources import TFRecordSource
from tpu_pipeline.system import local_path


@dataclasses.dataclass(frozen=True)
class DatasetDirSource(RecordFileSource):
    """A TFRecordSource over the shards metadata.json lists, with its exact cardinality when unsharded."""

    dir: str
    split: str = DEFAULT_SPLIT
    read: ReadOptions = ReadOptions()

    @property
    def compression(self) -> str:  # type: ignore[override]
        return read_dataset_metadata(self.dir).get("compression", "")

    def tfrecord_files(self) -> list[str]:
        _, entry = load_dataset_dir(self.dir, self.split)
        directory = local_path(self.dir)
        return [tf.io.gfile.join(directory, name) for name in entry["files"]]

    def info(self) -> DatasetInfo:
        metadata, entry = load_dataset_dir(self.dir, self.split)
        return DatasetInfo(int(entry["num_examples"]), metadata.get("class_names"), dir_features(self.dir))

    def files_source(self) -> TFRecordSource:
        _, entry = load_dataset_dir(self.dir, self.split)
        return TFRecordSource(files=self.tfrecord_files(), compression=self.compression, read=self.read,
                              counts=entry.get("counts"))

    def count_examples(self) -> int:
        return int(load_dataset_dir(self.dir, self.split)[1]["num_examples"])

    def epoch_length(self, context: tf.distribute.InputContext) -> Optional[int]:
        return self.files_source().epoch_length(context)

    def build(self, context: tf.distribute.InputContext, epoch: Optional[tf.Tensor] = None) -> tf.data.Dataset:
        source = self.files_source()
        dataset = source.build(context, epoch)
        blocks = self.read.record_block and self.read.keep_blocks  # then elements are blocks, not examples
        length = source.epoch_length(context)
        if length is not None and not blocks:
            # Tell tf.data (and Keras) the epoch length, and fail loudly if metadata.json is wrong.
            dataset = dataset.apply(tf.data.experimental.assert_cardinality(length))
        return dataset
