"""A mixture of record sources at set rates: one stream of serialized records, each with its source beside it.

Each source reads its own files (its own per-epoch file order and record shuffle, from a seed of
its own: `data.seed` and its name) and is positioned on its own: after `c` examples it is in epoch
`c // L` at record `c % L` (L: its epoch length on this input pipeline), exactly as a single
source resumes. `schedule.MixingSchedule` says which source each position draws from, so after `n`
delivered examples the whole mixture is at a place computed from `n` alone: the choice position
and every source's count (`schedule.MixturePositions`). A resume rebuilds every source at its count
and the choices at the choice position: the saved state stays the iterators' few integers, never
a buffer, where tf.data's `sample_from_datasets` can only resume by saving every source's buffers.

Each element is a block of mixed records with each record's source beside it
(`mixed_records.mixed`: `{RECORDS_KEY: records, SOURCE_KEY: sources}`), never inside it, so the
records go through the one parse of the pipeline unchanged and `SOURCE_KEY` is added after it.

With the plan's record cache, every source's records are read once into one vector in memory, and
the sources' streams are of indices into it: each block of the mixture is then one gather from that
vector, the only copy of a record before the parse (a single source's window shuffle makes two).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Callable, ClassVar, Optional, Sequence

import numpy as np
import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.format import DatasetInfo
from tpu_pipeline.pipeline.core.element_keys import RECORDS_KEY, SOURCE_KEY
from tpu_pipeline.pipeline.core.mixed_records import mixed
from tpu_pipeline.pipeline.mixtures.schedule import MixingSchedule, MixturePositions
from tpu_pipeline.pipeline.sources.base import ReadOptions, RecordFileSource
from tpu_pipeline.pipeline.stages.base import StageContext
from tpu_pipeline.pipeline.stages.shuffles import WindowShuffle

SOURCE_BLOCK = 256  # records per element each source reads when the plan reads single records
EXHAUSTED = ("repeat", "drop", "stop")


def source_seed(root: int, name: str) -> int:
    """A source's own seed root, from data.seed and its name (not its place in the list: reordering
    the sources keeps every source's order)."""
    digest = hashlib.blake2b(f"{int(root)}/mixture/{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 62) - 1)


@dataclasses.dataclass(frozen=True)
class MixturePart:
    """One source of a mixture: its records, its weight and what happens at its end."""

    name: str
    source: RecordFileSource
    weight: float
    exhausted: str = "repeat"  # repeat | drop | stop


@dataclasses.dataclass(frozen=True)
class MixtureSource(RecordFileSource):
    """Several record sources mixed by a deterministic schedule; `build_from(context, n)` starts after n examples.

    `weights` are the example rates the schedule keeps (with `weight_by: tokens`, the config's token
    weights divided by each source's mean tokens per example); `shuffle_buffer` the record shuffle
    each source runs on its own epochs (0: none).
    """

    seekable: ClassVar[bool] = True
    parts: tuple[MixturePart, ...]
    weights: tuple[float, ...]
    seed: int = 0
    shuffle_buffer: int = 0
    reshuffle_each_iteration: bool = True
    read: ReadOptions = ReadOptions()
    tokens_per_example: tuple[float, ...] = ()  # weight_by: tokens: each source's measured mean (else empty)
    # Weights changed on resume: the earlier (start example, example rates) segments; `weights` hold from `since`.
    earlier: tuple[tuple[int, tuple[float, ...]], ...] = ()
    since: int = 0
    # A resume on another number of hosts (`train/mixed_slice.py`): each source's stream begins at its epoch
    # `first_epochs[i]` (the epochs before were dealt); a rebuild of an old host's rest ends each at the end of
    # its epoch `last_epochs[i]` (-1: nothing). Empty: from epoch 0, and no end but the source's own.
    first_epochs: tuple[int, ...] = ()
    last_epochs: tuple[int, ...] = ()

    def _schedule(self, segment: int) -> MixingSchedule:
        weights = self.earlier[segment][1] if segment < len(self.earlier) else self.weights
        # Segment 0 keeps data.seed itself; a later one folds its start in (a fresh order from there).
        seed = self.seed if segment == 0 else source_seed(self.seed, f"segment@{self._starts()[segment]}")
        return MixingSchedule(tuple(float(w) for w in weights), seed)

    def _starts(self) -> list[int]:
        return [start for start, _ in self.earlier] + [self.since]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(part.name for part in self.parts)

    def tfrecord_files(self) -> list[str]:
        return [path for part in self.parts for path in part.source.tfrecord_files()]

    def files_source(self) -> "MixtureSource":
        return self

    def record_sources(self) -> tuple[RecordFileSource, ...]:
        return tuple(part.source for part in self.parts)

    def info(self) -> DatasetInfo:
        first = self.parts[0].source.info()
        counts = [part.source.info().num_examples for part in self.parts]
        total = sum(counts) if all(count is not None for count in counts) else None
        return dataclasses.replace(first, num_examples=total) if dataclasses.is_dataclass(first) else first

    def count_examples(self) -> Optional[int]:
        return sum(part.source.count_examples() for part in self.parts)

    def epoch_length(self, context: tf.distribute.InputContext) -> Optional[int]:
        return None  # a mixture has no epochs of its own; its sources do (build_from positions them)

    @property
    def per_epoch(self) -> bool:
        return False

    def with_read(self, read: ReadOptions) -> "MixtureSource":
        # Every source reads blocks of records (the mixture lays them out a block at a time), with a seed of
        # its own; the mixture yields its blocks (`keep_blocks`) or single records, as the plan asks.
        blocks = dataclasses.replace(read, keep_blocks=True, cache_records=False,
                                     record_block=read.record_block or SOURCE_BLOCK)
        parts = tuple(dataclasses.replace(part, source=part.source.with_read(
            dataclasses.replace(blocks, seed=source_seed(read.seed, part.name)))) for part in self.parts)
        # cache_records (the plan's record_cache) stays the mixture's own (`_record_cache`): every source's records
        # are then held in memory, and each source reads its epochs as indices into them, the same stream as from
        # its files.
        return dataclasses.replace(self, parts=parts, read=read)

    def _origin(self, index: int, context: tf.distribute.InputContext) -> int:
        """Where source `index`'s stream begins on this input pipeline: the start of its epoch `first_epochs[index]`."""
        first = self.first_epochs[index] if self.first_epochs else 0
        return first * self._length(self.parts[index], context) if first else 0

    def _totals(self, context: tf.distribute.InputContext) -> list[Optional[int]]:
        """Records each source holds for this input pipeline from its origin (None: it repeats without end)."""
        totals = []
        for index, part in enumerate(self.parts):
            ends = []
            if part.exhausted != "repeat":
                ends.append(self._length(part, context))
            if self.last_epochs:
                ends.append((self.last_epochs[index] + 1) * self._length(part, context))
            totals.append(max(0, min(ends) - self._origin(index, context)) if ends else None)
        return totals

    def epoch_lengths(self, context: tf.distribute.InputContext) -> list[int]:
        """Each source's epoch length on this input pipeline."""
        return [self._length(part, context) for part in self.parts]

    def source_places(self, context: tf.distribute.InputContext, delivered: int) -> np.ndarray:
        """Where each source's own stream stands once this input pipeline delivered `delivered` examples: the
        records of it read since its epoch 0 (a few integers, from the schedule's closed form)."""
        starts, bases = self._starts(), self._bases(context)
        segment = max(k for k, start in enumerate(starts) if start <= delivered or k == 0)
        positions = self.positions(context, segment, bases[segment])
        taken = bases[segment] + positions.taken(positions.locate(max(0, delivered - starts[segment])))
        return taken + np.array([self._origin(index, context) for index in range(len(self.parts))], np.int64)

    def positions(self, context: tf.distribute.InputContext, segment: Optional[int] = None,
                  base: Optional[Sequence[int]] = None) -> MixturePositions:
        """The schedule of `segment` (default: the weights in force now) with each source's end on this
        input pipeline (None: it repeats), less what it delivered before the segment (`base`)."""
        segment = len(self.earlier) if segment is None else segment
        base = base if base is not None else [0] * len(self.parts)
        totals = tuple(None if total is None else max(0, total - taken)
                       for total, taken in zip(self._totals(context), base))
        return MixturePositions(self._schedule(segment), totals, tuple(part.exhausted == "stop" for part in self.parts))

    def _bases(self, context: tf.distribute.InputContext) -> list[np.ndarray]:
        """What each source had delivered when each segment of weights began."""
        starts = self._starts()
        bases = [np.zeros(len(self.parts), np.int64)]
        for segment in range(len(starts) - 1):
            positions = self.positions(context, segment, bases[-1])
            bases.append(bases[-1] + positions.taken(positions.locate(starts[segment + 1] - starts[segment])))
        return bases

    def build(self, context: tf.distribute.InputContext, epoch: Optional[tf.Tensor] = None) -> tf.data.Dataset:
        return self.build_from(context, 0)

    def build_from(self, context: tf.distribute.InputContext, delivered: int) -> tf.data.Dataset:
        """The mixed records of this input pipeline after its first `delivered`, exactly the rest of the
        stream: each segment of weights from where the stream is in it, up to where the next begins."""
        starts, bases = self._starts(), self._bases(context)
        first = max(k for k, start in enumerate(starts) if start <= delivered or k == 0)
        cache = self._record_cache()  # one for every segment: the records are read and held once
        pieces = []
        for segment in range(first, len(starts)):
            offset = max(0, delivered - starts[segment])
            piece = self._segment(context, segment, bases[segment], offset, cache)
            if segment + 1 < len(starts):  # the old weights only up to where the new ones begin
                piece = piece.unbatch().take(starts[segment + 1] - max(delivered, starts[segment])).batch(SOURCE_BLOCK)
            pieces.append(piece)
        mixed_stream = pieces[0]
        for piece in pieces[1:]:
            mixed_stream = mixed_stream.concatenate(piece)
        return mixed_stream if self.read.keep_blocks else mixed_stream.unbatch()

    def _segment(self, context: tf.distribute.InputContext, segment: int, base: np.ndarray, offset: int,
                 cache: Optional[tuple[tf.data.Dataset, np.ndarray]] = None) -> tf.data.Dataset:
        """Segment `segment`'s mixed records after its first `offset`, as mixed elements: one per block of the schedule.

        Block b takes the next quota[i] records of every source i in one vector each (`rebatch`), and
        lays them out in the block's order with one `dynamic_stitch`: position p gets the k-th record of
        its source when it is that source's k-th choice in the block, exactly as choosing record by
        record would, at a cost per block instead of per record. With the record cache the sources'
        vectors are of indices into the cached records, and the block is one gather from them: each
        record is copied once; from files, twice (the quota's rebatch and the stitch). A source with fewer
        left (drop) leaves its later choices out; a `stop` source's first choice past its end cuts the
        block and ends it all.
        """
        positions = self.positions(context, segment, base)
        schedule = positions.schedule
        block, within = divmod(positions.locate(offset), schedule.block)
        taken = base + positions.taken(block * schedule.block)
        totals = self._totals(context)
        quotas = schedule.quotas
        # cache: None, or (the one vector of every source's records, where each source's records begin in it)
        empty = tf.data.Dataset.from_tensors(tf.zeros([0], tf.string if cache is None else tf.int64)).repeat()
        vectors = []
        for index, part in enumerate(self.parts):
            if quotas[index] == 0:
                vectors.append(empty)
                continue
            first = None if cache is None else int(cache[1][index])
            records = self._stream(index, part, context, int(taken[index]), totals[index], first)
            vectors.append(records.rebatch(int(quotas[index])).concatenate(empty))
        stops = tf.constant([part.exhausted == "stop" for part in self.parts])
        live = tf.constant(quotas > 0)
        size = schedule.block
        starts = np.cumsum(quotas) - quotas  # source i's choices in a block: order[starts[i]: starts[i] + quotas[i]]

        def laid_out(number: tf.Tensor, choices: tf.Tensor, parts: tuple) -> tuple:
            """(records or indices in the block's order, their sources, whether a stop source cut the block,
            whether every source has ended): any block, with sources that end and a resume within it."""
            order = tf.argsort(choices, stable=True)  # positions by source, then by position
            rank = tf.scatter_nd(order[:, None], tf.range(size, dtype=tf.int64) - tf.gather(starts, tf.gather(choices, order)),
                                 [size])  # k: position p is its source's k-th choice in the block
            available = tf.stack([tf.shape(part, out_type=tf.int64)[0] for part in parts])
            present = rank < tf.gather(available, choices)
            short_stop = tf.logical_and(tf.logical_not(present), tf.gather(stops, choices))
            cut = tf.where(tf.reduce_any(short_stop), tf.argmax(short_stop, output_type=tf.int64), size)
            where = tf.range(size, dtype=tf.int64)
            first = tf.where(tf.equal(number, block), tf.constant(within, tf.int64), 0)
            keep = present & (where < cut) & (where >= first)
            # Source i's kept choices are the run of its ranks [low, high): before `first` are its first
            # choices, past its records or the cut its last ones. Each record (or index) of a run is put
            # in its place among the kept positions.
            mine = tf.equal(choices[None, :], tf.range(len(parts), dtype=tf.int64)[:, None])  # [sources, size]
            low = tf.math.count_nonzero(mine & (where < first)[None, :], axis=1)
            high = tf.maximum(low, tf.minimum(available, tf.math.count_nonzero(mine & (where < cut)[None, :], axis=1)))
            place = tf.cumsum(tf.cast(keep, tf.int32), exclusive=True)
            indices, data = [], []
            for index, part in enumerate(parts):
                indices.append(tf.gather(place, order[int(starts[index]) + low[index]:int(starts[index]) + high[index]]))
                data.append(part[low[index]:high[index]])  # the whole vector (no copy) but where a block is cut
            finished = tf.logical_not(tf.reduce_any(tf.logical_and(live, available > 0)))
            return tf.dynamic_stitch(indices, data), tf.boolean_mask(choices, keep), cut < size, finished

        def whole(choices: tf.Tensor, parts: tuple) -> tuple:
            """`laid_out` of a block every source fills (all repeat) and no resume cuts: source i's k-th
            record to its k-th position, nothing else to work out (a third of the ops)."""
            order = tf.argsort(choices, stable=True)
            placed = [(order[int(begin):int(begin) + int(quota)], part)
                      for begin, quota, part in zip(starts, quotas, parts) if quota]
            return (tf.dynamic_stitch([positions for positions, _ in placed], [part for _, part in placed]), choices,
                    tf.constant(False), tf.constant(False))

        every_block_whole = all(total is None for total in totals)

        def mix(number: tf.Tensor, parts: tuple, everything: Optional[tf.Tensor] = None) -> tuple:
            choices = schedule._block_tensor(number)
            if not every_block_whole:
                laid = laid_out(number, choices, parts)
            elif within:  # a resume within the first block: that one cut at `within`
                laid = tf.cond(tf.equal(number, block), lambda: laid_out(number, choices, parts),
                               lambda: whole(choices, parts))
            else:
                laid = whole(choices, parts)
            records, sources, cut, finished = laid
            if everything is not None:
                records = tf.gather(everything, records)
            return mixed(records, sources), cut, finished

        streams = (tf.data.Dataset.range(block, (1 << 62) // size), tf.data.Dataset.zip(tuple(vectors)))
        if cache is not None:
            streams += (cache[0].repeat(),)
        mixed_blocks = tf.data.Dataset.zip(streams).map(mix, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

        def running(ended: tf.Tensor, element: tuple) -> tuple:
            records, cut, finished = element
            return tf.logical_or(ended, cut), (records, tf.logical_or(ended, finished))

        mixed_blocks = mixed_blocks.scan(tf.constant(False), running).take_while(lambda records, done: tf.logical_not(done))
        return mixed_blocks.map(lambda records, done: records).filter(lambda records: tf.size(records[RECORDS_KEY]) > 0)

    def _record_cache(self) -> Optional[tuple[tf.data.Dataset, np.ndarray]]:
        """With the plan's record cache (read.cache_records): a dataset of one element, every source's
        records in one vector (all of them, whichever this input pipeline's share: its share moves
        between files as their order changes each epoch), read from the files once and then held in
        memory; and where each source's records begin in it. None without the cache."""
        if not self.read.cache_records:
            return None
        files = [part.source.files_source() for part in self.parts]
        counts = np.asarray([sum(source.record_counts()) for source in files], np.int64)
        records = None
        for source in files:  # each source with its own compression, one after the other
            paths = source.tfrecord_files()
            read = tf.data.TFRecordDataset(paths, compression_type=source.compression,
                                           buffer_size=source.read.buffer_bytes(paths[0]))
            records = read if records is None else records.concatenate(read)
        total = int(counts.sum())

        def counted(every: tf.Tensor) -> tf.Tensor:  # the sources' record counts place each one's records in it
            tf.debugging.assert_equal(tf.size(every, out_type=tf.int64), tf.constant(total, tf.int64), message=(
                f"data.mixture: the sources' files hold another number of records than their counts say ({total:,}): a "
                "file changed after metadata.json (or this run) counted it; tpu-pipeline verify names the file"))
            return every

        return records.batch(1 << 62).map(counted).cache(), np.cumsum(counts) - counts

    # What a checkpoint keeps beside the input position: the weights in force and since when (a few numbers).
    def resume_state(self) -> Optional[str]:
        segments = [[start, list(weights)] for start, weights in self.earlier] + [[self.since, list(self.weights)]]
        first = {"first_epochs": list(self.first_epochs)} if any(self.first_epochs) else {}
        return json.dumps({"names": list(self.names), "segments": segments,
                           "configured": [part.weight for part in self.parts], **first})

    @staticmethod
    def _saved_first(state: str) -> tuple[int, ...]:
        """The first epoch of each source's stream in a saved state (none: all from epoch 0)."""
        return tuple(int(epoch) for epoch in json.loads(state).get("first_epochs", ()))

    def _saved_segments(self, state: str) -> list[tuple[int, tuple[float, ...]]]:
        saved = json.loads(state)
        if saved["names"] != list(self.names):
            raise ConfigError(f"data.mixture: the checkpoint mixes {saved['names']}, this config {list(self.names)}; "
                              "keep the sources and their order to resume (set a weight to 0 to leave one out)")
        return [(int(start), tuple(float(w) for w in weights)) for start, weights in saved["segments"]]

    def as_saved(self, state: str) -> "MixtureSource":
        """The mixture exactly as the checkpoint made it, its last weights going on: what made the rows in
        flight at the save (a resume replays them to find where they end)."""
        segments = self._saved_segments(state)
        return dataclasses.replace(self, weights=segments[-1][1], earlier=tuple(segments[:-1]), since=segments[-1][0],
                                   first_epochs=self._saved_first(state))

    def stream_length(self, context: tf.distribute.InputContext) -> Optional[int]:
        """Examples of this input pipeline's whole stream, every segment of weights with its own (None: endless)."""
        length = self.positions(context, None, self._bases(context)[-1]).length
        return None if length is None else self.since + length

    def with_resume_state(self, state: str, example: int, margin: int,
                          when: Optional[Callable[[int], str]] = None) -> tuple["MixtureSource", Optional[str]]:
        """This mixture continuing a saved one whose stream is at `example`: the saved weights up to
        `example + margin` (the examples the window in flight holds pieces of: `reweighting.window_in_flight`),
        this config's from there, as one more segment of weights; and a line saying what changed
        (None: nothing). `when(switch)`: how the line says when the new weights take effect."""
        segments = self._saved_segments(state)
        going_on = dataclasses.replace(self, first_epochs=self._saved_first(state))  # its sources' epochs too
        if tuple(segments[-1][1]) == tuple(self.weights):
            return dataclasses.replace(going_on, earlier=tuple(segments[:-1]), since=segments[-1][0]), None
        switch = max(example + margin, segments[-1][0])
        change = self.weight_changes(state) or "the same configured weights, new measured token rates"
        taking = when(switch) if when is not None else (
            f"at example {switch:,} of this input pipeline's stream (example {example:,} now, the window in flight "
            "finishes with the old ones)")
        message = (f"data.mixture: weights changed since the checkpoint ({change}); they take effect {taking}; "
                   "every source continues where it stopped")
        return dataclasses.replace(going_on, earlier=tuple(segments), since=switch), message

    def weight_changes(self, state: str) -> str:
        """The configured weights that differ from a saved state's, as 'web 0.6 -> 0.5, ...' ('' where none do)."""
        was = json.loads(state)["configured"]
        return ", ".join(f"{name} {old:g} -> {part.weight:g}" for name, old, part in zip(self.names, was, self.parts)
                         if old != part.weight)

    def _length(self, part: MixturePart, context: tf.distribute.InputContext) -> int:
        length = part.source.epoch_length(context)
        if not length:
            raise ValueError(f"data.mixture source {part.name!r}: no fixed epoch length on input pipeline "
                             f"{context.input_pipeline_id}; use sharding auto (balanced) so it can be positioned")
        return length

    def _stream(self, index: int, part: MixturePart, context: tf.distribute.InputContext, taken: int,
                total: Optional[int], first_cached: Optional[int] = None) -> tf.data.Dataset:
        """Source `index` after its first `taken` records (from its origin: `_origin`), as vectors of records: its
        epochs (each with its file order and window shuffle) from epoch t // L, the first t % L records of that one
        cut off (t: origin + taken), up to its end (`last_epochs`) if it has one.

        `first_cached`: the record cache holds this source's records (in file-list order) from that index
        on (`_record_cache`). The vectors are then of indices into it, in the order the same reads would
        yield the records (`TFRecordSource.epoch_indices`: each epoch's at once), through the same window
        shuffle: the same stream, record for record, with no file read.
        """
        length = self._length(part, context)
        epoch_first, skip = divmod(self._origin(index, context) + taken, length)
        files = part.source.files_source()
        count = sum(files.record_counts()) if first_cached is not None else 0
        # Indices are cheap to permute: in the consumer's thread, where handing each window to another thread
        # and back would cost more than the work.
        shuffle = WindowShuffle(self.shuffle_buffer, source_seed(self.seed, part.name), self.reshuffle_each_iteration,
                                num_parallel_calls="autotune" if first_cached is None else 1, deterministic=True)

        def one_epoch(epoch: tf.Tensor) -> tf.data.Dataset:
            if first_cached is None:
                records = part.source.build(context, epoch)
            else:  # the epoch's indices at once, else read as its records would be (block by block)
                indices = files.epoch_indices(context, epoch, first_cached)
                records = (tf.data.Dataset.from_tensors(indices) if indices is not None else
                           files.build(context, epoch, records=tf.range(first_cached, first_cached + count, dtype=tf.int64)))
            if self.shuffle_buffer:
                records = shuffle.apply(records, StageContext(context, epoch=epoch))
            return records

        if total is not None and taken >= total:
            return tf.data.Dataset.from_tensors(tf.zeros([0], tf.string if first_cached is None else tf.int64)).take(0)
        if part.exhausted == "repeat":
            end = self.last_epochs[index] + 1 if self.last_epochs else 1 << 62
            return skip_records(tf.data.Dataset.range(epoch_first, end).flat_map(one_epoch), skip)
        return skip_records(one_epoch(tf.constant(0, tf.int64)), epoch_first * length + skip)


def skip_records(vectors: tf.data.Dataset, count: int) -> tf.data.Dataset:
    """A stream of record vectors without its first `count` records (whole vectors dropped, one cut)."""
    if not count:
        return vectors

    def cut(remaining: tf.Tensor, vector: tf.Tensor) -> tuple:
        dropped = tf.minimum(remaining, tf.shape(vector, out_type=tf.int64)[0])
        return remaining - dropped, vector[dropped:]

    return vectors.scan(tf.constant(count, tf.int64), cut).filter(lambda vector: tf.size(vector) > 0)
