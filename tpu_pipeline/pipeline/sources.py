"""Source stages: where elements come from, and how they are split between input pipelines.

Sharding follows tensorflow/models' InputReader: with at least as many files as input pipelines,
each pipeline reads its own files (a seeded file shuffle, identical on every host, so shards never
overlap); with fewer files, every pipeline reads everything and keeps every n-th element.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
from absl import logging

from tpu_pipeline.pipeline._common import AUTOTUNE, read_buffer, tune
from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.system import local_path


def list_files(patterns: Union[str, Sequence[str]]) -> list[str]:
    """Expands globs (comma-separated or a list; local or gs://) to a sorted, de-duplicated file list."""
    if isinstance(patterns, str):
        patterns = [p.strip() for p in patterns.split(",") if p.strip()]
    files: list[str] = []
    for pattern in patterns:
        pattern = local_path(pattern)
        matched = tf.io.gfile.glob(pattern)
        if not matched:
            raise DataError(
                f"data.source.files: pattern {pattern!r} matches no file; check the path "
                "(and that gs:// credentials are set up on this machine)"
            )
        files.extend(matched)
    return sorted(set(files))


def choose_sharding(requested: str, num_files: int, num_pipelines: int) -> str:
    """'none', 'file' or 'element' for this many files and input pipelines."""
    if num_pipelines <= 1 or requested == "off":
        return "none"
    if requested == "auto":
        if num_files >= num_pipelines:
            return "file"
        logging.warning(
            "Only %d file(s) for %d input pipelines: sharding by element, so every pipeline reads "
            "every file and keeps 1/%d of the records. Write at least %d shards to shard by file.",
            num_files, num_pipelines, num_pipelines, num_pipelines,
        )
        return "element"
    if requested == "file" and num_files < num_pipelines:
        raise ConfigError(
            f"data.source.sharding=file needs at least one file per input pipeline, but there are "
            f"{num_files} file(s) for {num_pipelines} pipelines; use sharding=auto or element, or write more shards"
        )
    return requested


@dataclasses.dataclass(frozen=True)
class TFRecordSource:
    """Lists, shuffles, shards and interleaves TFRecord files; yields serialized records."""

    files: Union[str, Sequence[str]]
    compression: str = ""
    shuffle_files: bool = True
    file_seed: int = 0
    sharding: str = "auto"
    cycle_length: Union[int, str] = 16
    block_length: int = 1
    num_parallel_calls: Union[int, str] = "autotune"
    deterministic: Optional[bool] = None
    buffer_size: Union[int, str] = "auto"
    record_batch: int = 0
    keep_blocks: bool = False  # with record_batch: yield the blocks (for a WindowShuffle or Batch(records=True))
    cache_records: bool = False  # hold what the interleave yields in memory after the first pass

    def tfrecord_files(self) -> list[str]:
        return list_files(self.files)

    def build(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
        files = list_files(self.files)
        buffer = read_buffer(self.buffer_size, files[0])
        mode = choose_sharding(self.sharding, len(files), context.num_input_pipelines)
        dataset = tf.data.Dataset.from_tensor_slices(files)
        if self.shuffle_files:
            # Same seed on every host → same permutation each epoch → disjoint file shards.
            dataset = dataset.shuffle(len(files), seed=self.file_seed, reshuffle_each_iteration=True)
        if mode == "file":
            dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        deterministic = self.deterministic
        if mode == "element" and deterministic is False:
            logging.warning("Element sharding needs a deterministic interleave; ignoring deterministic=false.")
        if mode == "element":
            deterministic = True  # every pipeline must see the same order to keep disjoint elements
        num_files_here = len(files) // context.num_input_pipelines if mode == "file" else len(files)
        cycle = tune(self.cycle_length)
        if cycle != AUTOTUNE:
            cycle = max(1, min(cycle, num_files_here))
        sequential = self.num_parallel_calls == 0
        dataset = dataset.interleave(
            lambda path: self._read_file(path, buffer),
            cycle_length=cycle,
            block_length=self.block_length,
            # 0: read in the consumer's thread; order is then deterministic anyway.
            num_parallel_calls=None if sequential else tune(self.num_parallel_calls),
            deterministic=None if sequential else deterministic,
        )
        if mode == "element":
            # Blocks come in the same order on every pipeline (deterministic), so sharding them works too.
            dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        if self.cache_records:
            # Later epochs replay this pipeline's records from memory: no file read, no CRC, no copy.
            # The cache freezes the first epoch's order, so the builder shuffles all of them after it.
            dataset = dataset.cache()
        if self.record_batch and not self.keep_blocks:
            dataset = dataset.unbatch()
        return dataset

    def _read_file(self, path: tf.Tensor, buffer: int) -> tf.data.Dataset:
        """One file's records; with record_batch, in blocks of that many (unbatched after the interleave).

        tf.data's cost is per element crossing threads: moving blocks of records through the
        parallel interleave instead of single records cuts that cost by the block size.
        """
        records = tf.data.TFRecordDataset(path, compression_type=self.compression, buffer_size=buffer)
        return records.batch(self.record_batch) if self.record_batch else records


@dataclasses.dataclass(frozen=True)
class ArraySource:
    """In-memory arrays (the classic tutorials' from_tensor_slices), sharded by element."""

    arrays: Mapping[str, np.ndarray]
    sharding: str = "auto"

    @classmethod
    def from_npz(cls, path: str, sharding: str = "auto") -> "ArraySource":
        if not tf.io.gfile.exists(path):
            raise DataError(f"data.source.path: {path!r} does not exist")
        with tf.io.gfile.GFile(path, "rb") as handle:
            loaded = np.load(handle)
            return cls(arrays={k: loaded[k] for k in loaded.files}, sharding=sharding)

    def build(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
        lengths = {key: len(value) for key, value in self.arrays.items()}
        if len(set(lengths.values())) != 1:
            raise DataError(f"in-memory arrays differ in their first dimension: {lengths}; they must all be equal")
        dataset = tf.data.Dataset.from_tensor_slices(dict(self.arrays))
        if choose_sharding(self.sharding, 0, context.num_input_pipelines) != "none":
            dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        return dataset
