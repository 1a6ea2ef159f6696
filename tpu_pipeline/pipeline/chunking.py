"""Examples → a stream of chunks of at most a row's length, each numbered by (example, chunk).

Why: the packer's memory is bounded by configuration only if no item it holds is longer than a
row. A window of W examples holds W × (the longest document) tokens: one 30 MB document in a
window of 1024 examples took 23 GB. Cut into chunks first, a window of W items holds at most
W × length tokens whatever the data, and a long document streams through window after window.

A chunk's number, (example, chunk), is a position in the stream: the `example`-th example since
the stream's start (the epoch's records in their seeded order, so `Pipeline.build(start=example)`
skips to it unparsed), and the `chunk`-th piece of it. A resume needs nothing else: the chunks
from any (example, chunk) on are the same, whatever block boundaries the parse used.

    chunks = chunk_stream(parsed, ["inputs", "targets"], {"inputs": 256, "targets": 256}, "split",
                          start_example=0, start_chunk=0)
    windows = chunks.rebatch(1024)       # W chunks a window: ≤ 1024 × 256 tokens per key

Elements come in blocks (ragged [n, None] per key, with `EXAMPLE` and `CHUNK` int64 [n]) and
never one chunk per element: tf.data's cost is per element (`Dataset.rebatch` cuts windows
from blocks as they come).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import tensorflow as tf

from tpu_pipeline.pipeline.packing import expand_counts

EXAMPLE = "_example"  # int64: the example's index in the stream (since the stream's start)
CHUNK = "_chunk"  # int64: the chunk's index within its example
EXAMPLES_PER_BLOCK = 64  # single examples are grouped into blocks of this many before chunking

Features = dict[str, Any]


def is_block(spec: Mapping[str, Any], keys: Sequence[str]) -> bool:
    """Elements that already are blocks (a batched parse's windows): each key a ragged batch [n, None]."""
    return all(isinstance(spec[key], tf.RaggedTensorSpec) and spec[key].shape.rank == 2 for key in keys)


def as_blocks(dataset: tf.data.Dataset, keys: Sequence[str]) -> tf.data.Dataset:
    """Elements as blocks of examples (each key a ragged [n, None]): single examples are
    ragged-batched; blocks (a batched parse's ragged batches) pass as they are."""
    return dataset if is_block(dataset.element_spec, keys) else dataset.ragged_batch(EXAMPLES_PER_BLOCK)


def overflow_message(key: str, length: int, splits: bool = False) -> str:
    """The one line an example longer than its row gets with overflow: error (`splits`: the mode can
    also split it into chunks)."""
    fix = "truncate (or split)" if splits else "truncate"
    return (f"data.sequence: an example of {key} is longer than length {length}; set "
            f"data.sequence.overflow: {fix}, raise data.sequence.length, or cut it with a truncate op")


def overflow_check(counts: tf.Tensor, keys: Sequence[str], limits: Sequence[int], splits: bool) -> tf.Operation:
    """overflow=error: one InvalidArgumentError naming the key and the length."""
    checks = []
    for i, (key, limit) in enumerate(zip(keys, limits)):
        longest = tf.reduce_max(tf.concat([counts[:, i], [0]], 0))
        checks.append(tf.debugging.assert_less_equal(longest, tf.constant(limit, tf.int64),
                                                     message=overflow_message(key, limit, splits)))
    return tf.group(checks)


def chunk_block(block: Features, first_example: tf.Tensor, keys: Sequence[str], lengths: Mapping[str, int],
                overflow: str, start_example: int, start_chunk: int, carried: Sequence[str] = ()) -> Features:
    """One block of examples (numbered from `first_example`) → its chunks, in stream order.

    `split`: example e becomes ceil(longest key / its length) chunks, chunk c holding tokens
    [c × length_k, (c + 1) × length_k) of every key k (the keys' chunks stay aligned); `truncate`:
    its head only; `error`: its head, after checking it is the whole. An example with no token
    in any key makes no chunk. Chunks before (`start_example`, `start_chunk`) are dropped (a
    resume that starts inside a document). `carried`: per-example features ([n], e.g. a mixture's
    source) each chunk keeps a copy of.
    """
    limits = [int(lengths[key]) for key in keys]
    ragged = [block[key] for key in keys]
    counts = tf.stack([tf.cast(r.row_lengths(), tf.int64) for r in ragged], axis=1)  # [n, K]
    limit = tf.constant(limits, tf.int64)
    if overflow == "split":
        per_example = tf.reduce_max((counts + limit - 1) // limit, axis=1)
    else:
        per_example = tf.cast(tf.reduce_max(counts, axis=1) > 0, tf.int64)
    checks = [overflow_check(counts, keys, limits, splits=True)] if overflow == "error" else []
    with tf.control_dependencies(checks):
        example, chunk = expand_counts(per_example)
    number = first_example + example
    keep = tf.logical_or(number > start_example, chunk >= start_chunk)
    dropped = tf.reduce_sum(1 - tf.cast(keep, tf.int64))  # a resume inside a document: its first chunks
    example, chunk, number = (t[dropped:] for t in (example, chunk, number))
    out: Features = {EXAMPLE: number, CHUNK: chunk}
    out.update({name: tf.gather(block[name], example) for name in carried})
    for key, r, length in zip(keys, ragged, limits):
        skipped = chunk * length
        size = tf.clip_by_value(tf.gather(tf.cast(r.row_lengths(), tf.int64), example) - skipped, 0, length)
        if overflow == "split":
            # Every token is in exactly one chunk, in order: the chunks are a view of the values from the
            # first kept token (no copy of a long document).
            first = tf.cast(tf.size(r.flat_values, tf.int64) - tf.reduce_sum(size), tf.int64)
            out[key] = tf.RaggedTensor.from_row_lengths(r.flat_values[first:], size)
        else:
            start = tf.gather(tf.cast(r.row_starts(), tf.int64), example) + skipped
            index = tf.ragged.range(start, start + size)
            out[key] = tf.RaggedTensor.from_row_splits(tf.gather(r.flat_values, index.flat_values), index.row_splits)
    return out


def chunk_stream(dataset: tf.data.Dataset, keys: Sequence[str], lengths: Mapping[str, int], overflow: str,
                 start_example: int = 0, start_chunk: int = 0, carried: Sequence[str] = ()) -> tf.data.Dataset:
    """`dataset`'s examples (single, or blocks) as blocks of chunks numbered from `start_example`.

    `dataset` must start at example `start_example` of the stream; its first `start_chunk` chunks
    are left out.
    """
    blocks = as_blocks(dataset, keys)
    kept = list(keys)

    def number(next_example: tf.Tensor, block: Features) -> tuple[tf.Tensor, tuple[tf.Tensor, Features]]:
        size = tf.cast(block[kept[0]].nrows(), tf.int64)
        return next_example + size, (next_example, block)

    # One scan step per block (not per example): the block's first example number.
    numbered = blocks.scan(tf.constant(start_example, tf.int64), number)
    return numbered.map(lambda first, block: chunk_block(block, first, kept, lengths, overflow, start_example,
                                                         start_chunk, carried), name="chunk")
