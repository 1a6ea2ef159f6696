"""What old input pipelines had left, dealt to another number of them: a resume on another slice.

Two kinds of stream, one rule (R in turns, new pipeline j of M reads R[taken + j], R[taken + j + M], ...):
- a stream of examples deals records (`core.remainder.Remainder`; `records_share`): nothing is parsed that a
  new pipeline does not keep;
- a packed stream deals rows (`core.row_remainder.RowRemainder`; `rows_share`): each old pipeline's stream is
  rebuilt from its place and packed as it packed it, its records cut at the end of the remainder's epoch.
  Every new pipeline packs all of R and keeps its share, once, for the rest of one epoch.

Part of `Pipeline.build` (builder.py), kept apart for its size: these functions take the Pipeline and the
parts it builds from, and call its epoch and stream builders.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from tpu_pipeline.pipeline.core.remainder import MixedRemainder, Remainder
from tpu_pipeline.pipeline.core.resume_position import POSITION_KEYS, position_fields
from tpu_pipeline.pipeline.core.row_remainder import IN_REST, RowRemainder
from tpu_pipeline.pipeline.mixtures.mixture_source import SOURCE_BLOCK
from tpu_pipeline.pipeline.sequences.chunking import is_block
from tpu_pipeline.pipeline.sequences.sequence_stages import window_of
from tpu_pipeline.pipeline.stages.batching import row_blocks, rows_in_blocks
from tpu_pipeline.pipeline.stages.base import StageContext
from tpu_pipeline.pipeline.stages.roles import Parts

SHARE_BLOCK = 256  # dealt rows a block, as the Batch after cuts its batches from blocks

Pipeline = Any  # builder.Pipeline, whose `build` calls these (not imported: builder imports this module)


def skip_examples(dataset: tf.data.Dataset, count: int) -> tf.data.Dataset:
    """The dataset without its first `count` examples, where elements may be vectors of serialized
    records (blocks or windows): those are cut at the record, never parsed."""
    if not count:
        return dataset
    if record_blocks(dataset):
        return dataset.unbatch().skip(count).batch(1024)
    return dataset.skip(count)


def take_examples(dataset: tf.data.Dataset, count: int) -> tf.data.Dataset:
    """The dataset's first `count` examples, cut at the record as `skip_examples` cuts."""
    if record_blocks(dataset):
        return dataset.unbatch().take(count).batch(1024)
    return dataset.take(count)


def record_blocks(dataset: tf.data.Dataset) -> bool:
    """True where the elements are vectors of serialized records (blocks or windows), to be cut at the record."""
    spec = dataset.element_spec
    return isinstance(spec, tf.TensorSpec) and spec.dtype == tf.string and spec.shape.rank == 1


def records_share(pipeline: Pipeline, parts: Parts, context: tf.distribute.InputContext,
                  remainder: Remainder) -> tf.data.Dataset:
    """This input pipeline's share of what the old layout's pipelines had left (`remainder.Remainder`):
    each old pipeline's stream rebuilt as the old layout built it (its epochs, seeds and shard) from
    where it stopped to the end of epoch E, the streams taken in turn, a record each, and every M-th
    record of that from `taken + j` on. Blocks of records are cut to records and made blocks again,
    as `skip_examples` does; nothing is parsed that this pipeline does not keep."""
    streams, blocks = [], False
    for index in range(remainder.hosts):
        old = tf.distribute.InputContext(remainder.hosts, index, context.num_replicas_in_sync)
        one_epoch, differ = pipeline._epochs(parts, old, cached=False)  # no cache files for another slice's hosts
        epoch, offset = divmod(remainder.examples[index], remainder.length)
        head = lambda dataset, offset=offset: skip_examples(dataset, offset)  # noqa: E731
        stream = (parts.repeat.epochs(one_epoch, differ, first=epoch, head=head) if parts.repeat is not None
                  else head(one_epoch(tf.constant(epoch, tf.int64))))
        blocks = record_blocks(stream)
        streams.append((stream.unbatch() if blocks else stream).take(remainder.left(index)))
    share = share_in_turns(streams, remainder, context)
    return share.batch(1024) if blocks else share


def mixed_share(pipeline: Pipeline, context: tf.distribute.InputContext, remainder: MixedRemainder) -> tf.data.Dataset:
    """This input pipeline's share of what a mixture's old pipelines had left (`remainder.MixedRemainder`): each old
    pipeline's mixture as its checkpoint made it, from its place, every source ending at the end of its epoch E_s
    (so the mixture ends once all have), the old pipelines taken in turn, a record each, and every M-th record of
    that from `taken + j` on. The mixed records (each with its source) are not parsed here."""
    streams, blocks = [], False
    for index in range(remainder.hosts):
        old = tf.distribute.InputContext(remainder.hosts, index, context.num_replicas_in_sync)
        source = dataclasses.replace(pipeline.source.as_saved(remainder.state(index)), last_epochs=remainder.epochs)
        stream = source.build_from(old, remainder.examples[index])
        blocks = source.read.keep_blocks
        streams.append(stream.unbatch() if blocks else stream)
    share = share_in_turns(streams, remainder, context)
    return share.batch(SOURCE_BLOCK) if blocks else share


def share_in_turns(streams: list[tf.data.Dataset], remainder: Remainder,
                   context: tf.distribute.InputContext) -> tf.data.Dataset:
    """R, the old pipelines' rests (`streams`) taken in turn, an element each, and of it input pipeline j of M's
    share: every M-th element from `remainder.taken + j` on."""
    most = max(remainder.left(index) for index in range(remainder.hosts))
    turns = tf.data.Dataset.range(remainder.hosts).repeat(most)
    everything = tf.data.Dataset.choose_from_datasets(streams, turns, stop_on_empty_dataset=False)
    return everything.skip(remainder.taken + context.input_pipeline_id).shard(context.num_input_pipelines, 0)


def rows_left(pipeline: Pipeline, windowed: Parts, remainder: RowRemainder) -> tf.data.Dataset:
    """R, one row an element: the rows of `remainder.older` the old pipelines had not delivered, then each old
    pipeline's rows from its own place to the end of the remainder's epoch, taken in turns, a row each. `windowed`:
    the parts through the packing stage."""
    streams = []
    for index in range(remainder.hosts):
        old = tf.distribute.InputContext(remainder.hosts, index, remainder.replicas)
        example, chunk, delivered = remainder.own_place(index)
        if remainder.states:  # a mixture: as the old pipeline's state made it, each source ending at its E_s
            source = pipeline.source.as_saved(remainder.state(index))
            made = pipeline.with_source(dataclasses.replace(source, last_epochs=remainder.epochs))
            streams.append(made._stream(windowed, old, example, skip_outputs=delivered, chunk=chunk))
            continue
        streams.append(pipeline._stream(windowed, old, example, skip_outputs=delivered, chunk=chunk,
                                        stop=remainder.stop))
    turns = tf.data.Dataset.range(remainder.hosts).repeat()
    rows = tf.data.Dataset.choose_from_datasets(streams, turns, stop_on_empty_dataset=False)
    if remainder.older is None:
        return rows
    examples = tf.constant([place[0] for place in remainder.places], tf.int64)
    chunks = tf.constant([place[1] for place in remainder.places], tf.int64)

    def left(row: tf.Tensor, _: dict) -> tf.Tensor:
        """Row `row` of `older` not delivered: its old host (each read every hosts-th row) was still in `older`,
        before that row."""
        host = row % remainder.hosts
        return tf.logical_and(tf.equal(chunks[host], IN_REST), row >= examples[host])

    older = rows_left(pipeline, windowed, remainder.older).enumerate().filter(left).map(lambda _, row: row)
    return older.concatenate(rows)


def rows_share(pipeline: Pipeline, windowed: Parts, context: tf.distribute.InputContext,
               remainder: RowRemainder, next_row: int) -> tf.data.Dataset:
    """This input pipeline's rows of R from row `next_row` on, every M-th, each carrying as its place the index
    of the pipeline's next row (`IN_REST`): what a checkpoint saves while it reads them."""
    pipelines = context.num_input_pipelines

    def placed(row: tf.Tensor, features: dict) -> dict:
        kept = {key: value for key, value in features.items() if key not in POSITION_KEYS}
        return {**kept, **position_fields(row + pipelines, tf.constant(IN_REST, tf.int64), tf.zeros([], tf.int64))}

    return rows_left(pipeline, windowed, remainder).enumerate().skip(next_row).shard(pipelines, 0).map(placed)


def dealt_rows_then_own(pipeline: Pipeline, windowed: Parts, context: tf.distribute.InputContext,
                        remainder: RowRemainder, place: tuple[int, int, int], own_start: int) -> tf.data.Dataset:
    """A packed input pipeline's rows on a slice still dealing `remainder`: its share of R from its place (in
    R: `IN_REST`), then its own stream from `own_start`; or, past its share, its own stream from its place."""
    example, chunk, delivered = place
    if chunk != IN_REST:
        return pipeline._stream(windowed, context, example, skip_outputs=delivered, chunk=chunk)
    own = pipeline._stream(windowed, context, own_start)
    share = rows_share(pipeline, windowed, context, remainder, example)
    pools = row_blocks(own)
    if pools is None:
        return share.concatenate(own)
    # Blocks on, so that a Batch after still cuts its batches from them (`rows_in_blocks`) for the rest of the run.
    return rows_in_blocks(share.batch(SHARE_BLOCK).concatenate(pools))


def bucket_examples_delivered(pipeline: Pipeline, place: tuple[int, int, int], groups: int, replicas: int,
                              global_batch: Optional[int] = None) -> int:
    """Examples of a bucket window, in bucket order, that a stream on `replicas` replicas (of `global_batch`: this
    pipeline's if None) at `place` (the window's start, examples of it delivered before, outputs after those) had
    delivered once it took `groups` groups (a step's batch each) of it: what a resume skips where its groups are
    others (`bucket_batch: tokens` rounds each bucket's batch per replica; another global batch). The window's
    records are parsed once to find its buckets."""
    example, skipped, _ = place
    stage = pipeline.parts.windowed
    if global_batch is not None:
        stage = dataclasses.replace(stage, global_batch_size=global_batch)
    context = tf.distribute.InputContext(1, 0, replicas)  # every host reads the whole stream (`_shared_buckets`)
    examples = pipeline._stream(pipeline.parts.until("windowed"), context, example)
    windows = examples if is_block(examples.element_spec, stage.keys) else window_of(examples, stage.window, stage.keys)
    for window in windows.take(1):
        counts = np.bincount(stage.bucket_of(window).numpy(), minlength=len(stage.bucket_lengths))
        break
    else:
        return skipped
    delivered, before = skipped, 0
    for count, size in zip(counts, stage.group_sizes(context)):
        left = int(count) - min(int(count), max(0, skipped - before))  # this bucket's examples after `skipped`
        taken = min(groups, -(-left // size))  # its groups the stream took
        delivered += min(left, taken * size)
        groups -= taken
        before += int(count)
    return delivered


def next_pool(pipeline: Pipeline, windowed: Parts, context: tf.distribute.InputContext,
              place: tuple[int, int, int]) -> Optional[tuple[int, int]]:
    """(example, chunk) where the pool after the one at `place` starts in input pipeline `context`'s stream;
    None where the stream ends in that pool. Its records are parsed and cut into chunks, none packed
    (`PackRows.pool_starts`), once, at a resume on another slice."""
    example, chunk, _ = place
    records = pipeline._stream(windowed.until("windowed"), context, example)
    starts = windowed.windowed.pool_starts(records, StageContext(context, examples=example, chunk=chunk))
    for start, first in starts.skip(1).take(1):
        return int(start), int(first)
    return None
