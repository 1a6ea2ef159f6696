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
never one chunk per element: tf.data's cost is per element. The packer cuts its windows the
cheaper way, from blocks of plain tensors (`parts=True`, `window_stream`, `from_parts`): the same
windows as `rebatch` makes.
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
            out[key] = _heads(r, example, skipped, size)
    return out


def _heads(ragged: tf.RaggedTensor, example: tf.Tensor, skipped: tf.Tensor, size: tf.Tensor) -> tf.RaggedTensor:
    """Chunk i: tokens [skipped_i, skipped_i + size_i) of row example_i (truncate, error: one chunk an
    example at most, so `skipped` is 0 but for a resume).

    The chunks are runs of the block's values in order, and what lies between them (a cut tail, a chunk
    left out on resume) is rare: the values split at those gaps only, and the runs between gaps copied
    whole (`tf.gather` of a ragged tensor's rows copies each row as one range). A gather of every token by
    its index reads an index per token besides; with no gap at all (documents that fit a row), nothing is copied.
    """
    values = ragged.flat_values
    first = tf.gather(tf.cast(ragged.row_starts(), tf.int64), example) + skipped  # [n] each chunk's first token
    last = first + size
    total = tf.size(values, tf.int64)
    following = tf.concat([first[1:], [total]], 0)  # where the next chunk (or the block's end) starts
    gap = following > last  # a gap after chunk i
    lead = tf.concat([first[:1], [total]], 0)[0]  # tokens before the first chunk (all of them without chunks)
    # Runs: [0, lead) left out, then kept and left out in turn: [lead, last_i) kept, [last_i, following_i) left out...
    pairs = tf.reshape(tf.stack([tf.boolean_mask(last, gap), tf.boolean_mask(following, gap)], axis=1), [-1])
    bounds = tf.concat([[0, lead], pairs, [total]], 0)
    runs = tf.RaggedTensor.from_row_splits(values, bounds, validate=False)
    kept = tf.gather(runs, tf.range(1, tf.size(bounds, tf.int64) - 1, 2)).flat_values
    splits = tf.concat([[0], tf.cumsum(size)], 0)
    return tf.RaggedTensor.from_row_splits(kept, splits, validate=False)


def chunk_stream(dataset: tf.data.Dataset, keys: Sequence[str], lengths: Mapping[str, int], overflow: str,
                 start_example: int = 0, start_chunk: int = 0, carried: Sequence[str] = (),
                 parts: bool = False) -> tf.data.Dataset:
    """`dataset`'s examples (single, or blocks) as blocks of chunks numbered from `start_example`.

    `dataset` must start at example `start_example` of the stream; its first `start_chunk` chunks
    are left out. `parts`: each block as `as_parts` gives it (what `window_stream` takes).
    """
    blocks = as_blocks(dataset, keys)
    kept = list(keys)

    def number(next_example: tf.Tensor, block: Features) -> tuple[tf.Tensor, tuple[tf.Tensor, Features]]:
        size = tf.cast(block[kept[0]].nrows(), tf.int64)
        return next_example + size, (next_example, block)

    # One scan step per block (not per example): the block's first example number.
    numbered = blocks.scan(tf.constant(start_example, tf.int64), number)
    def chunk(first: tf.Tensor, block: Features) -> Features:
        chunks = chunk_block(block, first, kept, lengths, overflow, start_example, start_chunk, carried)
        return as_parts(chunks, kept) if parts else chunks

    return numbered.map(chunk, name="chunk")


_LENGTHS = "_lengths"  # a key's chunk lengths beside its values, in `as_parts`
_CHUNKS = "_chunks"  # window_stream: where windows start and stop, in chunks


def as_parts(chunks: Features, keys: Sequence[str]) -> dict[str, tf.Tensor]:
    """A block (or window) of chunks as plain tensors: each key's values and its chunk lengths
    (`<key>_lengths`, int64), each per-chunk feature as it is. Between tf.data stages a ragged element
    travels encoded as a variant (a copy of its tokens each way); plain tensors travel as they are."""
    out = {name: value for name, value in chunks.items() if name not in keys}
    for key in keys:
        out[key] = chunks[key].flat_values
        out[key + _LENGTHS] = tf.cast(chunks[key].row_lengths(), tf.int64)
    return out


def from_parts(parts: Mapping[str, tf.Tensor], keys: Sequence[str]) -> Features:
    """`as_parts` undone: each key a ragged [n, None] again (no copy)."""
    lengths = {key + _LENGTHS for key in keys}
    out = {name: value for name, value in parts.items() if name not in lengths}
    for key in keys:
        out[key] = tf.RaggedTensor.from_row_lengths(parts[key], parts[key + _LENGTHS], validate=False)
    return out


def window_stream(chunks: tf.data.Dataset, keys: Sequence[str], window: int) -> tf.data.Dataset:
    """Blocks of chunks as parts (`chunk_stream(..., parts=True)`) cut into windows of `window` chunks
    (the last one partial where the stream ends), each as parts: `from_parts` gives the elements of
    `chunk_stream(...).rebatch(window)`, in the same order.

    How: a `scan` joins what the last block left over to the next block and gives the joined parts with
    where the whole windows among them start and stop; each window is then one element holding the
    joined parts (tensors pass between tf.data stages by reference) and cut from them by slicing. Tokens
    are copied about twice (the join, the cut), never one chunk at a time: `rebatch` of ragged blocks
    encodes and decodes every chunk as a variant, and even a ragged batch of whole windows copies its
    tokens one at a time. A last element marks the end of a finite stream, where the leftover leaves as the partial last
    window.
    """
    keys = list(keys)
    spec = chunks.element_spec
    names = list(spec)
    features = [name for name in names if name not in {*keys, *(key + _LENGTHS for key in keys)}]  # [n] each

    def empty() -> dict[str, tf.Tensor]:
        return {name: tf.zeros([0], spec[name].dtype) for name in names}

    end = tf.data.Dataset.from_tensors((empty(), True))
    marked = chunks.map(lambda block: (block, False)).concatenate(end)

    def cut(left: dict, element: tuple) -> tuple[dict, tuple[dict, dict]]:
        block, last = element
        joined = {name: tf.concat([left[name], block[name]], 0) for name in names}
        count = tf.size(joined[EXAMPLE], tf.int64)
        emit = tf.where(last, count, count // window * window)  # chunks that leave now
        bounds = {_CHUNKS: tf.concat([tf.range(0, emit, window), [emit]], 0)}  # of the windows that leave
        rest = {name: joined[name][emit:] for name in features}
        for key in keys:
            lengths = joined[key + _LENGTHS]
            bounds[key] = tf.gather(tf.concat([tf.zeros([1], tf.int64), tf.cumsum(lengths)], 0), bounds[_CHUNKS])
            rest[key], rest[key + _LENGTHS] = joined[key][bounds[key][-1]:], lengths[emit:]
        return rest, (joined, bounds)

    def windows(joined: dict, bounds: dict) -> tf.data.Dataset:
        spans = tf.data.Dataset.from_tensor_slices({name: (value[:-1], value[1:]) for name, value in bounds.items()})
        return tf.data.Dataset.zip((tf.data.Dataset.from_tensors(joined).repeat(), spans))

    def one(joined: dict, span: dict) -> dict[str, tf.Tensor]:
        first, stop = span[_CHUNKS]
        out = {name: joined[name][first:stop] for name in features}
        for key in keys:
            out[key] = joined[key][span[key][0]:span[key][1]]
            out[key + _LENGTHS] = joined[key + _LENGTHS][first:stop]
        return out

    return marked.scan(empty(), cut).flat_map(windows).map(one, name="window")
