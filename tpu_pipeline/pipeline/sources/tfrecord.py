"""TFRecord files as a source: listed, ordered per epoch from the seed tree, sharded (`sharding`) and
interleaved; yields serialized records, or blocks of them.

A balanced read (`_read_balanced`) has input pipeline i read records [iL, (i+1)L) of the epoch's
files laid end to end, touching only the files that range covers and skipping, unparsed, the head
of its first one; with the plan's record cache, the records are read once into memory and each
epoch's order is one vector of indices (`read_order`).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence, Union

import numpy as np
import tensorflow as tf
from absl import logging

from tpu_pipeline.errors import DataError
from tpu_pipeline.pipeline.core import seeds
from tpu_pipeline.pipeline.core.tuning import AUTOTUNE, tune
from tpu_pipeline.pipeline.sources import read_order
from tpu_pipeline.pipeline.sources.base import ReadOptions, RecordFileSource
from tpu_pipeline.pipeline.sources.files import check_sizes, count_records, list_files
from tpu_pipeline.pipeline.sources.sharding import balanced_range, choose_sharding


@dataclasses.dataclass(frozen=True)
class TFRecordSource(RecordFileSource):
    """Lists TFRecord files, orders them for the epoch, shards and interleaves them; yields serialized records."""

    files: Union[str, Sequence[str]]
    compression: str = ""
    read: ReadOptions = ReadOptions()
    counts: Optional[Sequence[int]] = None  # records per file, in tfrecord_files() order, where known
    exact_files: bool = False  # `files` is the final list, in order (e.g. with repaired copies): no glob, no sort

    @functools.cached_property
    def _listed(self) -> tuple[str, ...]:
        """The files, globbed once per source object: a pipeline builds, sizes and shards from one list."""
        if self.exact_files:
            return tuple(self.files)
        return tuple(list_files(self.files))

    @functools.cached_property
    def _counts(self) -> tuple[int, ...]:
        if self.counts is not None:
            counts = tuple(int(c) for c in self.counts)
            if not self.compression:  # a compressed file can be smaller than its framing
                check_sizes(self.tfrecord_files(), counts, "metadata.json")
            return counts
        counts = tuple(count_records(self.tfrecord_files(), self.compression))
        empty = [path for path, count in zip(self.tfrecord_files(), counts) if count == 0]
        if empty:
            logging.warning("%d of the %d files matched by data.source.files hold no record (e.g. %s): "
                            "nothing is read from them; check that they were written completely",
                            len(empty), len(counts), empty[0])
        return counts

    def tfrecord_files(self) -> list[str]:
        return list(self._listed)

    def record_counts(self) -> list[int]:
        """Records per file: given (metadata.json), else one fast pass over the files (no parse), once per process."""
        return list(self._counts)

    def listed_counts(self) -> list[Optional[int]]:
        """Records per file as listed (metadata.json), None each where not: what a file should hold,
        without reading it (verify and on_error: skip compare against it)."""
        return [int(c) for c in self.counts] if self.counts is not None else [None] * len(self.tfrecord_files())

    def files_source(self) -> "TFRecordSource":
        return self

    def count_examples(self) -> int:
        return sum(self.record_counts())

    def epoch_length(self, context: tf.distribute.InputContext) -> Optional[int]:
        mode = choose_sharding(self.read.sharding, len(self.tfrecord_files()), context.num_input_pipelines, balanced=True)
        if mode == "none":
            return self.count_examples()
        if mode == "balanced":
            low, high = balanced_range(self.count_examples(), context, self.read.cover_all)
            return high - low
        return None  # file shards differ per epoch; element shards of blocks are uneven

    def build(self, context: tf.distribute.InputContext, epoch: Optional[tf.Tensor] = None,
              records: Optional[tf.Tensor] = None) -> tf.data.Dataset:
        """This input pipeline's records of `epoch`. `records`: every record of the files in file-list order,
        one vector in memory (a mixture's record cache): the same stream, taken from it with no file read."""
        read = self.read
        files = self.tfrecord_files()
        buffer = read.buffer_bytes(files[0])
        mode = choose_sharding(read.sharding, len(files), context.num_input_pipelines, balanced=True)
        order = self._file_order(epoch)
        if mode == "balanced" or records is not None:
            if mode not in ("balanced", "none"):
                raise ValueError(f"records in memory are read balanced or unsharded, not with sharding {mode!r}")
            return self._finish(self._read_balanced(files, order, context, buffer, records, every=mode == "none"))
        names = tf.constant(files) if order is None else tf.gather(tf.constant(files), order)
        dataset = tf.data.Dataset.from_tensor_slices(names)
        if mode == "file":
            dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        deterministic = read.deterministic
        if mode == "element" and deterministic is False:
            logging.warning("Element sharding needs a deterministic interleave; ignoring deterministic=false.")
        if mode == "element":
            deterministic = True  # every pipeline must see the same order to keep disjoint elements
        num_files_here = len(files) // context.num_input_pipelines if mode == "file" else len(files)
        cycle = tune(read.cycle_length)
        if cycle != AUTOTUNE:
            cycle = max(1, min(cycle, num_files_here))
        sequential = read.num_parallel_calls == 0
        dataset = dataset.interleave(
            lambda path: self._read_file(path, buffer),
            cycle_length=cycle,
            block_length=read.block_length,
            # 0: read in the consumer's thread; order is then deterministic anyway.
            num_parallel_calls=None if sequential else tune(read.num_parallel_calls),
            deterministic=None if sequential else deterministic,
        )
        if mode == "element":
            # Blocks come in the same order on every pipeline (deterministic), so sharding them works too.
            dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        return self._finish(dataset)

    def epoch_indices(self, context: tf.distribute.InputContext, epoch: tf.Tensor, first: int = 0) -> Optional[tf.Tensor]:
        """The indices of this input pipeline's records of `epoch` in the order `build(context, epoch, records=...)`
        yields them, the files' records held in memory from index `first` on (file-list order): one int64
        vector, computed at once (`read_order`) instead of a tf.data element per block. None where that
        order is not known here: records not read in blocks, or a cycle_length the machine picks (autotune)."""
        read = self.read
        files = self.tfrecord_files()
        mode = choose_sharding(read.sharding, len(files), context.num_input_pipelines, balanced=True)
        if mode not in ("balanced", "none") or not read.record_block or not isinstance(read.block_length, int):
            return None
        (begins, skips, takes), cycle = self._balanced_runs(files, self._file_order(epoch), context, True, mode == "none")
        if cycle == AUTOTUNE:
            return None
        block, block_length = read.record_block, read.block_length

        def replay(begins: np.ndarray, skips: np.ndarray, takes: np.ndarray) -> np.ndarray:
            return read_order.epoch_indices(begins + skips + first, takes, block, cycle, block_length)

        return tf.ensure_shape(tf.numpy_function(replay, [begins, skips, takes], tf.int64, stateful=False), [None])

    def _file_order(self, epoch: Optional[tf.Tensor]) -> Optional[tf.Tensor]:
        """The epoch's file order: the same permutation on every input pipeline (it depends on seed and epoch
        only), so shards never overlap; a new one each epoch. None: file-list order."""
        if not self.read.shuffle_files:
            return None
        return seeds.file_order(len(self.tfrecord_files()), self.read.seed, 0 if epoch is None else epoch)

    def _read_balanced(self, files: list[str], order: Optional[tf.Tensor], context: tf.distribute.InputContext,
                       buffer: int, records: Optional[tf.Tensor] = None, every: bool = False) -> tf.data.Dataset:
        """Records [i*L, (i+1)*L) of the epoch's files laid end to end: (file, skip, take) per file touched.
        `records` (all of them, file-list order): each file's run taken from it. `every`: unsharded, the
        same interleave as reading whole files (every file, an empty one too, in its order)."""
        read = self.read
        runs, cycle = self._balanced_runs(files, order, context, records is not None, every)
        dataset = tf.data.Dataset.from_tensor_slices(runs)
        sequential = read.num_parallel_calls == 0
        if records is None:
            one_file = lambda path, first, count: self._read_file(path, buffer, first, count)  # noqa: E731
        else:
            one_file = lambda begin, first, count: self._read_memory(records, begin + first, count)  # noqa: E731
        return dataset.interleave(
            one_file,
            cycle_length=cycle, block_length=read.block_length,
            num_parallel_calls=None if sequential else tune(read.num_parallel_calls),
            deterministic=None if sequential else read.deterministic,
        )

    def _balanced_runs(self, files: list[str], order: Optional[tf.Tensor], context: tf.distribute.InputContext,
                       in_memory: bool, every: bool) -> tuple[tuple[tf.Tensor, tf.Tensor, tf.Tensor], int]:
        """((name, or where its records begin in memory; skip; take) of each file the range touches, in read order),
        and the interleave's cycle length."""
        read = self.read
        counts = self.record_counts()
        pipelines, index = (1, 0) if every else (context.num_input_pipelines, context.input_pipeline_id)
        length = sum(counts) // pipelines
        if length == 0 and not read.cover_all and not every:
            raise DataError(f"data.source: {sum(counts)} record(s) cannot be split between {pipelines} input pipelines")
        left_out = 0 if read.cover_all else sum(counts) - length * pipelines
        if left_out and index == 0:
            logging.warning(
                "%d of %d records are left out of each epoch so that each of the %d input pipelines reads %d (the "
                "last of each epoch's order: other ones every epoch when files are shuffled)",
                left_out, sum(counts), pipelines, length)
        # Each file: its name, or (records in memory) where its records begin in `records`.
        names = tf.constant(files) if not in_memory else tf.constant(np.cumsum(counts) - np.asarray(counts), tf.int64)
        sizes = tf.constant(counts, tf.int64)
        if order is not None:
            names, sizes = tf.gather(names, order), tf.gather(sizes, order)
        ends = tf.cumsum(sizes)
        starts = ends - sizes
        low, high = (0, sum(counts)) if every else balanced_range(sum(counts), context, read.cover_all)
        skip = tf.clip_by_value(low - starts, 0, sizes)
        stop = tf.clip_by_value(high - starts, 0, sizes)
        touched = tf.ones_like(sizes, tf.bool) if every else stop > skip
        runs = (tf.boolean_mask(names, touched), tf.boolean_mask(skip, touched), tf.boolean_mask(stop - skip, touched))
        # Files a range touches: at most its share of the files plus the two it shares with neighbours.
        most = min(len(files), -(-len(files) // pipelines) + 1)
        cycle = tune(read.cycle_length)
        if cycle != AUTOTUNE:
            cycle = max(1, min(cycle, most))
        return runs, cycle

    def _finish(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        read = self.read
        if read.cache_records:
            # Later epochs replay this pipeline's records from memory: no file read, no CRC, no copy.
            # The cache freezes the first epoch's order (and, sharded, this pipeline's records), so
            # the plan shuffles all of them after it.
            dataset = dataset.cache()
        if read.record_block and not read.keep_blocks:
            dataset = dataset.unbatch()
        return dataset

    def _read_memory(self, records: tf.Tensor, begin: tf.Tensor, count: tf.Tensor) -> tf.data.Dataset:
        """records[begin: begin + count] as _read_file yields a file's: in blocks of record_block, or singly. Each
        record is copied once, by a gather: a slice would share `records`' buffer, and tf.data's memory accounting
        logs an error for every element that does."""
        block = self.read.record_block
        if not block:
            return tf.data.Dataset.range(count).map(lambda k: tf.gather(records, begin + k))
        return tf.data.Dataset.range((count + block - 1) // block).map(
            lambda k: tf.gather(records, tf.range(begin + k * block, begin + tf.minimum((k + 1) * block, count))))

    def _read_file(self, path: tf.Tensor, buffer: int, skip: Optional[tf.Tensor] = None,
                   take: Optional[tf.Tensor] = None) -> tf.data.Dataset:
        """One file's records (records [skip, skip+take) of it when given); with record_block, in
        blocks of that many (unbatched after the interleave).

        tf.data's cost is per element crossing threads: moving blocks of records through the
        parallel interleave instead of single records cuts that cost by the block size.
        """
        records = tf.data.TFRecordDataset(path, compression_type=self.compression, buffer_size=buffer)
        if skip is not None:
            records = records.skip(skip).take(take)
        return records.batch(self.read.record_block) if self.read.record_block else records
