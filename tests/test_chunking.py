"""The packer's chunk stream and its windows (tpu_pipeline.pipeline.sequences.chunking) against a plain Python
reference: every chunk's tokens and number, windows of exactly `window` chunks in stream order, whatever
the parse's blocks (smaller or larger than a window), with long tails cut, empty documents and a resume
inside a document; and a block of chunks never holds more than twice its chunks' tokens."""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpu_pipeline.pipeline.sequences.chunking import (CHUNK, EXAMPLE, Rows, chunk_stream, compact, from_parts, spans,
                                                      window_stream)

pytestmark = pytest.mark.tf_builds

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LENGTHS = {"inputs": 4, "targets": 3}


def reference_chunks(examples: list[dict], overflow: str, start_example: int, start_chunk: int) -> list[tuple]:
    """(example, chunk, tokens of each key) in stream order, as chunking.chunk_block documents it."""
    out = []
    for number, example in enumerate(examples, start_example):
        if overflow == "split":
            count = max(math.ceil(len(example[k]) / n) for k, n in LENGTHS.items())
        else:
            count = 1 if any(example[k] for k in LENGTHS) else 0
        for chunk in range(count):
            if number == start_example and chunk < start_chunk:
                continue
            out.append((number, chunk, *(tuple(example[k][chunk * n:(chunk + 1) * n]) for k, n in LENGTHS.items())))
    return out


def ragged_blocks(examples: list[dict], sizes: list[int]) -> list[dict]:
    """The examples as ragged blocks of the given sizes (the last block takes what is left)."""
    blocks, at = [], 0
    for size in sizes + [len(examples)]:
        if at >= len(examples):
            break
        part = examples[at:at + size]
        blocks.append({k: tf.ragged.constant([e[k] for e in part], dtype=tf.int64, ragged_rank=1) for k in LENGTHS})
        at += len(part)
    return blocks


SPEC = {k: tf.RaggedTensorSpec([None, None], tf.int64, 1, tf.int64) for k in LENGTHS}


def blocks_of(examples: list[dict], sizes: list[int]) -> tf.data.Dataset:
    """The examples as ragged blocks of the given sizes (the last block takes what is left)."""
    blocks = ragged_blocks(examples, sizes)
    return tf.data.Dataset.from_generator(lambda: iter(blocks), output_signature=SPEC)


# The pipelines below are built (their functions traced: most of a draw's time) once per setting and
# iterated once per draw: their source reads the blocks a draw put in BLOCKS when an iterator starts.
BLOCKS: list[dict] = []


def current_blocks() -> tf.data.Dataset:
    return tf.data.Dataset.from_generator(lambda: iter(list(BLOCKS)), output_signature=SPEC)


@functools.lru_cache(maxsize=None)
def window_pipeline(overflow: str, window: int, start_example: int, start_chunk: int) -> tf.data.Dataset:
    """window_stream(chunk_stream(BLOCKS)), each window as ragged chunks (`from_parts`, traced once)."""
    chunks = chunk_stream(current_blocks(), list(LENGTHS), LENGTHS, overflow, start_example=start_example,
                          start_chunk=start_chunk)
    return window_stream(chunks, list(LENGTHS), window).map(lambda parts: from_parts(parts, list(LENGTHS)))


def windows_of(examples: list[dict], sizes: list[int], window: int, overflow: str, start_example: int = 0,
               start_chunk: int = 0) -> list[list[tuple]]:
    """The windows of the examples' chunks, parsed in blocks of `sizes`, as `as_chunks` lists."""
    BLOCKS[:] = ragged_blocks(examples, sizes)
    try:
        return [as_chunks(chunks) for chunks in window_pipeline(overflow, window, start_example, start_chunk)]
    finally:
        BLOCKS.clear()


@functools.lru_cache(maxsize=None)
def truncated_block_sizes() -> tf.data.Dataset:
    """chunk_stream(BLOCKS, truncate): per block and key, (tokens the block holds, its chunks' tokens)."""
    chunks = chunk_stream(current_blocks(), list(LENGTHS), LENGTHS, "truncate")

    def sizes(parts: dict) -> dict:
        held = {}
        for key in LENGTHS:
            values, _, lengths = spans(parts, key)
            held[key] = tf.stack([tf.size(values, tf.int64), tf.reduce_sum(lengths)])
        return held

    return chunks.map(sizes)


def as_chunks(chunks: dict) -> list[tuple]:
    """Ragged chunks (`from_parts`) as (example, chunk, tokens of each key) tuples."""
    numbers = zip(chunks[EXAMPLE].numpy().tolist(), chunks[CHUNK].numpy().tolist())
    tokens = [[tuple(row) for row in chunks[k].to_list()] for k in LENGTHS]
    return [(e, c, *(t[i] for t in tokens)) for i, (e, c) in enumerate(numbers)]


example = st.fixed_dictionaries({k: st.lists(st.integers(0, 99), max_size=3 * n + 2) for k, n in LENGTHS.items()})


@SETTINGS
@given(examples=st.lists(example, max_size=40), sizes=st.lists(st.integers(1, 12), max_size=12),
       window=st.integers(1, 9), overflow=st.sampled_from(["truncate", "split"]), start=st.integers(0, 2))
def test_windows_are_the_stream_cut_every_window_chunks(examples, sizes, window, overflow, start):
    first_chunk = start if overflow == "split" else 0  # a resume inside a document (split: it has several)
    windows = windows_of(examples, sizes, window, overflow, start_example=7, start_chunk=first_chunk)
    expected = reference_chunks(examples, overflow, 7, first_chunk)
    assert [c for w in windows for c in w] == expected
    assert all(len(w) == window for w in windows[:-1]) and (not windows or 0 < len(windows[-1]) <= window)


@pytest.mark.parametrize("window", [1, 3, 9, 25])
def test_windows_across_blocks_smaller_and_larger_than_a_window(window):
    # Blocks of 2 under a window of 9 leave nothing for several blocks; blocks of 13 hold whole windows.
    rng = np.random.default_rng(window)
    examples = [{k: rng.integers(0, 99, rng.integers(0, 3 * n)).tolist() for k, n in LENGTHS.items()} for _ in range(60)]
    sizes = [2, 2, 2, 2, 13, 1, 1, 20, 2, 5]
    for overflow in ("truncate", "split"):
        windows = windows_of(examples, sizes, window, overflow)
        assert [c for w in windows for c in w] == reference_chunks(examples, overflow, 0, 0)
        assert all(len(w) == window for w in windows[:-1])


@SETTINGS
@given(examples=st.lists(example, min_size=1, max_size=30), size=st.integers(1, 30))
def test_a_block_of_chunks_holds_at_most_twice_its_tokens(examples, size):
    # Cut tails (truncate) stay in the block's values only while they are the lesser half.
    BLOCKS[:] = ragged_blocks(examples, [size] * 30)
    try:
        held = list(truncated_block_sizes().as_numpy_iterator())
    finally:
        BLOCKS.clear()
    assert len(held) == math.ceil(len(examples) / size)
    for block in held:
        for key in LENGTHS:
            values, tokens = block[key].tolist()
            assert values <= 2 * tokens, (key, values, tokens)


def test_a_long_cut_tail_or_chunks_left_out_on_resume_are_copied_out_of_their_block():
    # A draw above catches a chunk pass that never compacts only where its data happen to cut enough;
    # these catch it every time: one document whose tail truncate cuts, and a resume past most of one.
    document = {"inputs": list(range(100, 114)), "targets": list(range(200, 203))}
    (parts,) = chunk_stream(blocks_of([document], [1]), list(LENGTHS), LENGTHS, "truncate")
    assert [spans(parts, k)[0].numpy().tolist() for k in LENGTHS] == [[100, 101, 102, 103], [200, 201, 202]]
    assert [spans(parts, k)[1].numpy().tolist() for k in LENGTHS] == [[0], [0]]
    (parts,) = chunk_stream(blocks_of([document], [1]), list(LENGTHS), LENGTHS, "split", start_chunk=3)
    assert [spans(parts, k)[0].numpy().tolist() for k in LENGTHS] == [[112, 113], []]
    assert as_chunks(from_parts(parts, list(LENGTHS))) == [(0, 3, (112, 113), ())]


def test_rows_cut_every_tensor_as_python_slicing_does_in_a_traced_function():
    """`Rows` (window_stream's cuts) against `t[begin:begin + size]`, for tensors of rank 1 and 2 sharing one cut,
    an empty cut, and size -1 (to the end), inside a tf.function as tf.data traces it."""
    vector, matrix = np.arange(7, dtype=np.int64), np.arange(21, dtype=np.int32).reshape(7, 3)

    @tf.function(input_signature=[tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int64)])
    def cut(begin, size):
        rows = Rows(begin, size)
        return rows(tf.constant(vector)), rows(tf.constant(matrix)), rows(tf.constant(vector) * 2)

    for begin, size in ((0, 7), (2, 3), (7, 0), (4, 0), (0, -1), (3, -1)):
        stop = None if size == -1 else begin + size
        got = [t.numpy() for t in cut(tf.constant(begin, tf.int64), tf.constant(size, tf.int64))]
        for out, expected in zip(got, (vector[begin:stop], matrix[begin:stop], vector[begin:stop] * 2)):
            np.testing.assert_array_equal(out, expected, err_msg=f"begin {begin}, size {size}")


def test_compact_copies_the_chunks_out_of_their_gaps():
    values = tf.constant(np.arange(20), tf.int64)
    kept, starts = compact(values, tf.constant([2, 5, 6, 15], tf.int64), tf.constant([2, 1, 3, 0], tf.int64))
    assert kept.numpy().tolist() == [2, 3, 5, 6, 7, 8] and starts.numpy().tolist() == [0, 2, 3, 6]


def test_a_stage_between_the_packer_and_the_batch_gets_the_same_rows():
    # A Batch right after the packer cuts its batches from the pools (stages.rows_in_blocks); any other stage
    # gets one row an element, and a Batch after it must make the same batches.
    from tpu_pipeline.pipeline.sequences.sequence_stages import PackRows
    from tpu_pipeline.pipeline.stages.base import StageContext
    from tpu_pipeline.pipeline.stages.batching import Batch, row_blocks

    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, 50, rng.integers(1, 12)).astype(np.int64) for _ in range(300)]
    examples = tf.data.Dataset.from_generator(lambda: ({"tokens": t} for t in tokens),
                                              output_signature={"tokens": tf.TensorSpec([None], tf.int64)})
    context = StageContext()
    rows = PackRows(["tokens"], 16, lengths={"tokens": 12}, row_shuffle=3, seed=5).apply(examples, context)
    assert row_blocks(rows) is not None
    through_a_map = rows.map(lambda row: row)
    assert row_blocks(through_a_map) is None
    direct, mapped = (list(Batch(8).apply(d, context).as_numpy_iterator()) for d in (rows, through_a_map))
    assert len(direct) == len(mapped) > 10
    for a, b in zip(direct, mapped):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
