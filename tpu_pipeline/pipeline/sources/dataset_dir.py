"""Reading a directory written by `tpu-pipeline convert` (or the demo): its metadata.json gives the
exact shard list, the feature spec, the example count and the class names, so a config needs only
`source: {type: tfrecord, dir: ..., split: train}`.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import tensorflow as tf

from tpu_pipeline.format import DEFAULT_SPLIT, DatasetInfo, dir_features, load_dataset_dir
from tpu_pipeline.pipeline.sources.base import ReadOptions, RecordFileSource
from tpu_pipeline.pipeline.sources.tfrecord import TFRecordSource
from tpu_pipeline.system import local_path


@dataclasses.dataclass(frozen=True)
class DatasetDirSource(RecordFileSource):
    """A TFRecordSource over the shards metadata.json lists, with its exact cardinality when unsharded."""

    dir: str
    split: str = DEFAULT_SPLIT
    read: ReadOptions = ReadOptions()
    replaced: Optional[TFRecordSource] = None  # the shards as data.on_error=skip left them (good records only)
    key: str = "data.source"  # the config section errors name (eval_data.source, a mixture's source)

    @functools.cached_property
    def _files(self) -> TFRecordSource:
        """The split's shards, compression and record counts, from one read of metadata.json."""
        if self.replaced is not None:
            return dataclasses.replace(self.replaced, read=self.read)
        metadata, entry = load_dataset_dir(self.dir, self.split, self.key)
        directory = local_path(self.dir)
        return TFRecordSource(files=[tf.io.gfile.join(directory, name) for name in entry["files"]],
                              compression=metadata.get("compression", ""), read=self.read, counts=entry.get("counts"))

    @property
    def compression(self) -> str:  # type: ignore[override]
        return self._files.compression

    def tfrecord_files(self) -> list[str]:
        return list(self._files.files)

    def info(self) -> DatasetInfo:
        metadata, entry = load_dataset_dir(self.dir, self.split, self.key)
        examples = sum(self.replaced.counts) if self.replaced is not None else int(entry["num_examples"])
        return DatasetInfo(examples, metadata.get("class_names"), dir_features(self.dir, self.key),
                           metadata.get("tokenizer"))

    def files_source(self) -> TFRecordSource:
        return self._files

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
