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
    windows = window_stream(chunks, ["inputs", "targets"], 1024)   # W chunks a window: ≤ 1024 × 256 tokens per key

Elements come in blocks and never one chunk per element (tf.data's cost is per element), as parts:
per key its values, each chunk's first token in them (`<key>_sources`) and its length
(`<key>_lengths`), with `EXAMPLE` and `CHUNK` int64 [n]. A chunk points into the values its block was
parsed into; its tokens are copied only where a window straddles two blocks, where a block would hold
more cut-off tokens than chunk tokens (`compact`), and once more when the packer writes the rows.
`from_parts` gives a block or window as ragged chunks [n, None] (a copy: for tests and tools).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import tensorflow as tf

from tpu_pipeline.pipeline.sequences.packing import expand_counts

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
    """One block of examples (numbered from `first_example`) → its chunks, in stream order, as parts:
    each key's values, each chunk's first token in them (`<key>_sources`) and its length (`<key>_lengths`).

    `split`: example e becomes ceil(longest key / its length) chunks, chunk c holding tokens
    [c × length_k, (c + 1) × length_k) of every key k (the keys' chunks stay aligned); `truncate`:
    its head only; `error`: its head, after checking it is the whole. An example with no token
    in any key makes no chunk. Chunks before (`start_example`, `start_chunk`) are dropped (a
    resume that starts inside a document). `carried`: per-example features ([n], e.g. a mixture's
    source) each chunk keeps a copy of.

    The chunks point into the block's values, no token copied, unless more than half of them lie
    outside every chunk (tails cut by truncate, chunks dropped by a resume): then the chunks' tokens
    are copied out (`compact`), so what a block of chunks holds stays within twice its chunks' tokens.
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
        count = tf.gather(counts[:, keys.index(key)], example)
        skipped = tf.minimum(chunk * length, count)  # a key shorter than another has empty chunks at its end
        size = tf.minimum(count - skipped, length)
        first = tf.gather(tf.cast(r.row_starts(), tf.int64), example) + skipped  # in order, within the values
        values = r.flat_values
        check = tf.debugging.assert_less(tf.size(values, tf.int64), tf.constant(_MOST_TOKENS, tf.int64), message=(
            f"data.sequence: a block of parsed records holds 2**31 tokens of {key} or more: too many to index; "
            "parse fewer records at a time (data.sequence.window) or cut the documents with a truncate op"))
        with tf.control_dependencies([check]):
            wasteful = 2 * tf.reduce_sum(size) < tf.size(values, tf.int64)
        out[key], out[key + _SOURCES] = tf.cond(wasteful, lambda v=values, f=first, n=size: compact(v, f, n),
                                                lambda v=values, f=first: (v, f))
        out[key + _LENGTHS] = size
    return out


_MOST_TOKENS = 1 << 31  # a block's (or a window's) tokens of a key are indexed in int32 when placed


def compact(values: tf.Tensor, first: tf.Tensor, size: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Chunks i (tokens [first_i, first_i + size_i) of `values`, in order) copied out: (their tokens
    one after another, where each starts there).

    The chunks are runs of the values in order, and what lies between them (a cut tail, a chunk
    left out on resume) is rare: the values split at those gaps only, and the runs between gaps copied
    whole (`tf.gather` of a ragged tensor's rows copies each row as one range). A gather of every token by
    its index reads an index per token besides.
    """
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
    return kept, tf.cumsum(size, exclusive=True)


def chunk_stream(dataset: tf.data.Dataset, keys: Sequence[str], lengths: Mapping[str, int], overflow: str,
                 start_example: int = 0, start_chunk: int = 0, carried: Sequence[str] = ()) -> tf.data.Dataset:
    """`dataset`'s examples (single, or blocks) as blocks of chunks numbered from `start_example`, as
    parts (`chunk_block`; what `window_stream` takes; `from_parts` gives each block as ragged chunks).

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


_LENGTHS = "_lengths"  # parts: a key's chunk lengths beside its values
_SOURCES = "_sources"  # parts: where each chunk's tokens start in its key's values


def from_parts(parts: Mapping[str, tf.Tensor], keys: Sequence[str]) -> Features:
    """Parts (`chunk_block`, `window_stream`) as chunks: each key a ragged [n, None] (a copy of the
    tokens: tests and tools; the packer places and writes rows from the parts themselves)."""
    names = {key + suffix for key in keys for suffix in (_LENGTHS, _SOURCES)}
    out = {name: value for name, value in parts.items() if name not in names}
    for key in keys:
        values, _ = compact(parts[key], parts[key + _SOURCES], parts[key + _LENGTHS])
        out[key] = tf.RaggedTensor.from_row_lengths(values, parts[key + _LENGTHS], validate=False)
    return out


def spans(parts: Mapping[str, tf.Tensor], key: str) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """A key's (values, first token of each chunk, its length) in parts."""
    return parts[key], parts[key + _SOURCES], parts[key + _LENGTHS]


def window_stream(chunks: tf.data.Dataset, keys: Sequence[str], window: int) -> tf.data.Dataset:
    """Blocks of chunks as parts (`chunk_stream`) cut into windows of `window` chunks (the last one
    partial where the stream ends), each as parts: `from_parts` gives the elements of
    `chunk_stream(...)` rebatched to `window` chunks, in the same order.

    How: a `scan` takes each block with what the last one left over (the chunks of a partial window);
    the window that holds leftover chunks is joined (its tokens copied into one tensor), and every other
    window points into the block's values (tensors pass between tf.data stages by reference; a window
    is its chunks' first tokens and lengths). So a token is copied at most once here, and only in a
    window that straddles two blocks: `rebatch` of ragged blocks encodes and decodes every chunk as a
    variant, and even a ragged batch of whole windows copies its tokens one at a time. A last element
    marks the end of a finite stream, where the leftover leaves as the partial last window.
    """
    keys = list(keys)
    spec = chunks.element_spec
    names = list(spec)
    per_chunk = [name for name in names if name not in keys]  # [n] each: sources, lengths, numbers, carried

    def empty() -> dict[str, tf.Tensor]:
        return {name: tf.zeros([0], spec[name].dtype) for name in names}

    end = tf.data.Dataset.from_tensors((empty(), True))
    marked = chunks.map(lambda block: (block, False)).concatenate(end)

    sources = {key + _SOURCES for key in keys}

    def joined(left: dict, block: dict, begin: tf.Tensor, stop: tf.Tensor) -> dict[str, tf.Tensor]:
        """All of `left`'s chunks, then `block`'s [begin, stop): their tokens copied into one tensor a key."""
        rows = Rows(begin, stop - begin)
        out = {name: tf.concat([left[name], rows(block[name])], 0) for name in per_chunk if name not in sources}
        for key in keys:
            values, first, size = spans(block, key)
            first, size = rows(first), rows(size)
            end_ = tf.reduce_max(tf.concat([first + size, [0]], 0))
            start = tf.reduce_min(tf.concat([first, [end_]], 0))
            out[key] = tf.concat([left[key], Rows(start, end_ - start)(values)], 0)
            out[key + _SOURCES] = tf.concat([left[key + _SOURCES], first - start + tf.size(left[key], tf.int64)], 0)
        return out

    def cut(left: dict, element: tuple) -> tuple[dict, tuple[dict, tf.Tensor, dict, tf.Tensor]]:
        block, last = element
        held, count = tf.size(left[EXAMPLE], tf.int64), tf.size(block[EXAMPLE], tf.int64)
        total = held + count
        emit = tf.where(last, total, total // window * window)  # chunks that leave now (the leftover's first)
        # The window that holds the leftover (when one leaves) is joined; the others point into the block.
        straddles = tf.logical_and(held > 0, emit > 0)
        size = tf.constant(window, tf.int64)
        head = tf.where(straddles, tf.minimum(size, emit) - held, 0)  # the block's chunks in the joined window
        def none(parts: dict, given: tf.Tensor) -> dict:
            """`parts` whole where `given`, else each empty."""
            rows = Rows(0, tf.where(given, -1, 0))
            return {name: rows(value) for name, value in parts.items()}

        first_window = joined(none(left, straddles), block, 0, head)
        stop = tf.maximum(emit - held, head)  # the block's chunks that leave now (none when no window leaves)
        starts = tf.range(head, stop, size)
        bounds = tf.stack([starts, tf.minimum(starts + size, stop)], axis=1)  # [windows, 2] in the block
        # Left over: every chunk when no window leaves (copied: a block smaller than a window), else the
        # block's from the leftover's first (copied: at most a window).
        rest = joined(none(left, tf.equal(emit, 0)), block, tf.maximum(emit - held, 0), count)
        return rest, (first_window, tf.cast(straddles, tf.int64), block, bounds)

    def windows(first_window: dict, straddles: tf.Tensor, block: dict, bounds: tf.Tensor) -> tf.data.Dataset:
        first = tf.data.Dataset.from_tensors(first_window).take(straddles)
        spans_ = tf.data.Dataset.from_tensor_slices(bounds)
        return first.concatenate(tf.data.Dataset.zip((tf.data.Dataset.from_tensors(block).repeat(), spans_)).map(one))

    def one(block: dict, span: tf.Tensor) -> dict[str, tf.Tensor]:
        rows = Rows(span[0], span[1] - span[0])
        out = {name: rows(block[name]) for name in per_chunk}
        out.update({key: block[key] for key in keys})
        return out

    return marked.scan(empty(), cut).flat_map(windows)


class Rows:
    """Rows [begin, begin + size) of any number of tensors (size -1: to the end), for 0 <= begin <= begin + size
    <= their rows, as `t[begin:begin + size]` gives them, with the bounds made once per rank.

    Why: `t[begin:stop]` with tensor bounds packs three bound vectors for every tensor it cuts (~7 ops), and
    a pipeline's ops are traced again on every build (each input pipeline, epoch and resume) and instantiated
    on every iterator. In `window_stream` it took a packed two-source mixture from 2,782 ops to 2,322."""

    def __init__(self, begin: Any, size: Any) -> None:
        self._begin = tf.cast(begin, tf.int64)
        self._size = tf.cast(size, tf.int64)
        self._bounds: dict[int, tuple[tf.Tensor, tf.Tensor]] = {}

    def __call__(self, tensor: tf.Tensor) -> tf.Tensor:
        rank = tensor.shape.rank
        if rank not in self._bounds:
            zeros, ends = [tf.constant(0, tf.int64)] * (rank - 1), [tf.constant(-1, tf.int64)] * (rank - 1)
            self._bounds[rank] = (tf.stack([self._begin] + zeros), tf.stack([self._size] + ends))
        return tf.slice(tensor, *self._bounds[rank])
