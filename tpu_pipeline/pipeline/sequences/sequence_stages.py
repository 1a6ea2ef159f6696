"""Variable-length token features into static shapes: pad each example, or bucket a window of them.

(Packing itself, several examples per row, is `tpu_pipeline.pipeline.sequences.packing`; the windowing and
the resume position that bucket and pack share are here, with `PackRows`.)

    PadTo({"tokens": 128})                       # [128] per example, plus tokens_mask
    Bucket(["tokens"], 4096, lengths={"tokens": 1024}, bucket_lengths=[128, 256, 512, 1024], global_batch_size=64)
    PackRows(["tokens"], 1024, lengths={"tokens": 1024})   # rows, then a Batch of rows

Windowed stages (bucket, pack) take `window` consecutive items of the stream, place them, and emit
their outputs; each output carries its resume position (`resume_position.POSITION_KEYS`): the stream position
(example, chunk) where its window starts, and its index among the window's outputs. A resume needs
only those three integers: `apply(position=example, chunk=chunk, skip=k)` rebuilds from there.
Bucket windows are `window` examples (each cut to `length` first, so a window holds at most
window × length tokens); pack windows are `window` chunks of at most `length` tokens
(`chunking`), and the rows of `row_shuffle` consecutive windows leave in a seeded permutation.
Token id 0 is a real token: a mask (pad, bucket) or a segment id (pack) marks padding, never a value.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping, Sequence

import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.core import seeds
from tpu_pipeline.pipeline.core.element_keys import EXAMPLE_MASK, SOURCE_KEY
from tpu_pipeline.pipeline.core.resume_position import position_fields
from tpu_pipeline.pipeline.core.tuning import tune
from tpu_pipeline.pipeline.sequences import carried_weights, packing
from tpu_pipeline.pipeline.sequences.chunking import (
    CHUNK, EXAMPLE, chunk_stream, is_block, overflow_message, spans, window_stream,
)
from tpu_pipeline.pipeline.sequences.packing import Packer
from tpu_pipeline.pipeline.stages.base import Stage, StageContext
from tpu_pipeline.pipeline.stages.batching import per_replica_batch_size, rows_in_blocks

Features = dict[str, Any]


def fit_length(tokens: tf.Tensor, key: str, length: int, overflow: str) -> tf.Tensor:
    """`tokens` (1-D) cut to `length` (overflow 'truncate'), or checked to fit ('error')."""
    if overflow == "error":
        check = tf.debugging.assert_less_equal(tf.size(tokens), length, message=overflow_message(key, length))
        with tf.control_dependencies([check]):
            return tf.identity(tokens)
    return tokens[:length]


def pad_example(features: Features, lengths: Mapping[str, int], overflow: str = "error") -> Features:
    """One example with each key of `lengths` cut or padded to its length, and `<key>_mask` (int32,
    1 on real tokens) beside it. Padding values are 0; only the mask tells padding."""
    out = features = carried_weights.apart(features, list(lengths))
    for key, length in lengths.items():
        tokens = fit_length(_one_d(features, key), key, length, overflow)
        size = tf.size(tokens)
        out[key] = tf.ensure_shape(tf.pad(tokens, [[0, length - size]]), [length])
        out[f"{key}_mask"] = tf.ensure_shape(tf.pad(tf.ones([size], tf.int32), [[0, length - size]]), [length])
    return out


def _one_d(features: Features, key: str) -> tf.Tensor:
    if key not in features:
        raise ConfigError(f"data.sequence.keys: feature {key!r} does not exist; features here: {sorted(features)}")
    value = features[key]
    if isinstance(value, tf.RaggedTensor):
        value = value.flat_values
    if value.shape.rank != 1:
        raise ConfigError(f"data.sequence.keys: feature {key!r} has shape {value.shape}; sequence keys are 1-D token "
                          "ids per example (kind: ragged, or a tokenize op)")
    return value


def pad_batch(features: Features, lengths: Mapping[str, int], overflow: str = "error") -> Features:
    """`pad_example` for a batch parsed as a whole: each key a ragged batch [B, None] → [B, length]
    with `<key>_mask`, the other features as they are."""
    out = features = carried_weights.apart(features, list(lengths))
    for key, length in lengths.items():
        tokens = features[key]
        if not isinstance(tokens, tf.RaggedTensor):
            raise ConfigError(f"data.sequence.keys: feature {key!r} is {tokens.shape}, not a ragged batch of token ids")
        checks = []
        if overflow == "error":
            longest = tf.reduce_max(tf.concat([tokens.row_lengths(), tf.zeros([1], tokens.row_splits.dtype)], 0))
            checks.append(tf.debugging.assert_less_equal(longest, tf.cast(length, longest.dtype),
                                                         message=overflow_message(key, length)))
        with tf.control_dependencies(checks):
            tokens = tokens[:, :length]
            out[key] = tf.ensure_shape(tokens.to_tensor(shape=[None, length]), [None, length])
            out[f"{key}_mask"] = tf.sequence_mask(tokens.row_lengths(), length, tf.int32)
    return out


@dataclasses.dataclass(frozen=True)
class PadTo(Stage):
    """Stage: every example's keys padded (or cut) to their lengths, with masks. Per example, so it
    is usually fused into the preprocessing map (`pad_example`); the stage is for use alone."""

    lengths: Mapping[str, int]
    overflow: str = "error"

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        return dataset.map(lambda features: pad_example(features, self.lengths, self.overflow), name="pad_to")


def window_of(dataset: tf.data.Dataset, window: int, keys: Sequence[str]) -> tf.data.Dataset:
    """Windows of `window` examples: the sequence keys as RaggedTensors [W, None], the others [W, ...]."""
    def ragged(features: Features) -> Features:
        return {name: (tf.RaggedTensor.from_tensor(value[tf.newaxis]) if name in keys and not isinstance(value, tf.RaggedTensor)
                       else value) for name, value in features.items()}

    spec = dataset.element_spec
    if all(name not in keys or isinstance(spec[name], tf.RaggedTensorSpec) or spec[name].shape.rank == 1 for name in spec):
        return dataset.ragged_batch(window)
    return dataset.map(ragged).ragged_batch(window)


@dataclasses.dataclass(frozen=True)
class Windowed(Stage):
    """Base of bucket and pack: windows of examples → each window's outputs, numbered for resume.

    A subclass gives `place(numbered_windows, context)`: a dataset of (window index, window
    features) → the outputs, each with the position keys (`resume_position.position_fields`).
    """

    keys: Sequence[str]
    window: int
    roles: ClassVar[tuple[str, ...]] = ("windowed",)
    mode_name: ClassVar[str] = ""  # the data.sequence mode that places windows this way (registry.MODES)

    def check_features(self, spec: Mapping[str, Any]) -> None:
        for key in self.keys:
            if key not in spec:
                raise ConfigError(f"data.sequence.keys: feature {key!r} does not exist; features here: {sorted(spec)}")

    def place(self, windows: tf.data.Dataset, context: tf.distribute.InputContext, first: int = 0,
              skipped: int = 0) -> tf.data.Dataset:
        raise NotImplementedError

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        """`context.examples`: examples of the stream delivered before (where the window to rebuild
        starts); it must fall on a window boundary. `context.chunk`: examples of the first window delivered
        before its outputs are counted (a bucket window resumed on another slice: `Bucket.outputs`);
        `context.skip`: outputs of the first window delivered before (after those)."""
        position, skip = context.examples, context.skip
        if carried_weights.as_two_keys(dataset.element_spec, self.keys) != dict(dataset.element_spec):
            dataset = dataset.map(lambda features: carried_weights.apart(features, self.keys), name="weights_apart")
        self.check_features(dataset.element_spec)
        if position % self.window:
            raise ValueError(f"a bucket window resumes at a window boundary: {position} is not a multiple of "
                             f"{self.window}")
        first = position // self.window
        if is_block(dataset.element_spec, self.keys):
            windows = dataset
        else:
            windows = window_of(dataset, self.window, self.keys)
        # One number per window (not per example): a zip costs per element.
        numbered = tf.data.Dataset.zip((tf.data.Dataset.range(first, 1 << 62), windows))
        placed = self.place(numbered, context.input, first, context.chunk)
        return placed.skip(skip) if skip else placed


@dataclasses.dataclass(frozen=True)
class PackRows(Windowed):
    """Pack mode: the stream cut into chunks of at most `length` (`chunking.chunk_stream`), pools of
    `row_shuffle` windows (or one) cut from it (`chunking.window_stream`) and packed in a parallel map
    (pools are independent): each window of `window` chunks placed as `packing.pack_window` places it,
    and the pool's rows written once (`packing.write_rows`), permuted by a seed of the seed tree
    (`seeds.ROW_SHUFFLE`, folded with the pool's first (example, chunk)).

    Why the shuffle: first-fit-decreasing places a window's largest items first, so without it a
    long document's chunks fill consecutive rows and a batch holds one or two documents. Why pools
    of whole windows: the rows of a pool are a pure function of its first (example, chunk), so a
    resume rebuilds the pool and skips what it delivered (at most one pool replayed, three integers
    saved), never a buffer. Memory: a pool's rows hold at most row_shuffle × window × length tokens per
    key; its chunks point into the block they were parsed in (no copy), kept until its last pool is written.
    `row_shuffle=0`: rows leave in packing order (evaluation).
    """

    mode_name: ClassVar[str] = "pack"
    lengths: Mapping[str, int] = dataclasses.field(default_factory=dict)
    algorithm: str = "first_fit_decreasing"
    overflow: str = "error"
    num_parallel_calls: Any = "autotune"
    row_shuffle: int = 0  # windows whose rows are permuted together; 0: rows in packing order
    seed: int = 0
    sources: int = 0  # a mixture's sources: each row counts its tokens and segments of each (0: not a mixture)

    def _packer(self, windows_given: bool = True) -> Packer:
        return Packer(dict(self.lengths), None if windows_given else self.window, self.algorithm, self.overflow)

    def check_features(self, spec: Mapping[str, Any]) -> None:
        # One line naming a feature that would ride along in a row, or a missing or misshapen key.
        spec = carried_weights.as_two_keys(spec, self.keys)
        given = all(key in spec for key in self.keys) and is_block(spec, self.keys)
        dataclasses.replace(self._packer(given), counted=self._counted(spec)).check_spec(spec)

    def _counted(self, spec: Mapping[str, Any]) -> dict[str, int]:
        """A mixture's source, when parsed: counted per row (`<key>_tokens`, `<key>_segments`)."""
        return {SOURCE_KEY: self.sources} if SOURCE_KEY in spec and self.sources else {}

    def _chunks(self, dataset: tf.data.Dataset, context: StageContext) -> tuple[tf.data.Dataset, list, Any, Any]:
        """(the stream's chunks from the context's (example, chunk), the keys chunked and written, the weights'
        pair riding in their targets' values or None, the spec with the weights as two keys)."""
        spec = carried_weights.as_two_keys(dataset.element_spec, self.keys)  # lm_shift's folded targets: two keys
        self.check_features(spec)
        keys = list(self.keys)
        calls = tune(self.num_parallel_calls)
        parallel = {} if calls == 1 else {"num_parallel_calls": calls}
        pair = carried_weights.carried_pair(keys, self.lengths, spec)  # the weights ride in their targets' values
        if pair is None and spec != dict(dataset.element_spec):  # folded, but the keys' lengths differ: two keys
            dataset = dataset.map(lambda features: carried_weights.apart(features, keys), name="weights_apart")
        if pair is not None:
            in_order = {"deterministic": True, **parallel} if parallel else {}  # (tf warns of one without the other)
            dataset = dataset.map(lambda features: carried_weights.fold(features, pair), name="carry_weights", **in_order)
        # The keys whose values are chunked and written; the placement still sees every key (`column`).
        written = [key for key in keys if pair is None or key != pair[0]]
        chunks = chunk_stream(dataset, written, self.lengths, self.overflow, context.examples, context.chunk,
                              list(self._counted(spec)))
        return chunks, written, pair, spec

    def pool_starts(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        """(example, chunk) where each pool of the stream starts, from the context's place, without packing any:
        what a resume on another slice needs to know where a host's pool in progress ends (`dealt.next_pool`)."""
        chunks, written, _, _ = self._chunks(dataset, context)
        pools = window_stream(chunks, written, self.window * max(1, self.row_shuffle))
        return pools.map(lambda parts: (parts[EXAMPLE][0], parts[CHUNK][0]))

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        chunks, written, pair, spec = self._chunks(dataset, context)
        keys, skip = list(self.keys), context.skip
        counted = self._counted(spec)
        calls = tune(self.num_parallel_calls)
        parallel = {} if calls == 1 else {"num_parallel_calls": calls}
        column = {key: (pair[1] if pair is not None and key == pair[0] else key) for key in keys}
        lengths = {key: self.lengths[key] for key in keys}
        windows = max(1, self.row_shuffle)  # a pool's windows
        pipeline = context.input_pipeline_id

        def place(counts: tf.Tensor, starts: tf.Tensor) -> dict[str, tf.Tensor]:
            """The pool's windows placed one after another (`packing.place_spans`: each chunk's row), rows
            numbered on from the windows before; no token moved."""
            if windows == 1:
                return packing.place_spans(counts, starts, lengths, self.algorithm, "truncate")
            total = tf.shape(counts)[0]
            names = (packing.ITEM_SIZE, packing.ITEM_SOURCE, packing.ITEM_EXAMPLE, packing.ITEM_ROW)
            arrays = tuple(tf.TensorArray(tf.int32, size=0, dynamic_size=True, infer_shape=False) for _ in names)

            def one(index: tf.Tensor, rows: tf.Tensor, arrays: tuple) -> tuple:
                first = index * self.window
                stop = tf.minimum(first + self.window, total)
                placed = packing.place_spans(counts[first:stop], starts[first:stop], lengths, self.algorithm,
                                             "truncate")
                placed[packing.ITEM_EXAMPLE] += first
                placed[packing.ITEM_ROW] += rows
                arrays = tuple(array.write(index, placed[name]) for array, name in zip(arrays, names))
                return index + 1, tf.reduce_max(tf.concat([placed[packing.ITEM_ROW] + 1, [rows]], 0)), arrays

            count = (total + self.window - 1) // self.window
            _, _, arrays = tf.while_loop(lambda index, *_: index < count, one, (0, 0, arrays))
            return {name: array.concat() for name, array in zip(names, arrays)}

        def pool(parts: Features) -> Features:
            """The rows of a pool (`row_shuffle` windows, or one), placed window by window and written once, in
            their order: packing order, or a seeded permutation of the pool's rows. The chunks' tokens stay where
            they are (the block they were parsed in): the rows are written from there."""
            example, first_chunk = parts[EXAMPLE][0], parts[CHUNK][0]
            counts = tf.stack([tf.cast(spans(parts, column[key])[2], tf.int32) for key in keys], axis=1)
            starts = tf.stack([tf.cast(spans(parts, column[key])[1], tf.int32) for key in keys], axis=1)
            items = place(counts, starts)  # chunks fit their rows already: no item is cut
            if pair is not None:  # the weights' column is the targets': written once, in the targets' values
                kept = [keys.index(key) for key in written]
                items = {**items, **{name: tf.gather(items[name], kept, axis=1)
                                     for name in (packing.ITEM_SIZE, packing.ITEM_SOURCE)}}
            named = {name: tf.gather(parts[name], items[packing.ITEM_EXAMPLE]) for name in counted}
            rows = items[packing.ITEM_ROW]
            count = tf.reduce_max(tf.concat([rows + 1, [0]], 0))
            if self.row_shuffle:
                seed = seeds.key(self.seed, seeds.ROW_SHUFFLE, pipeline, example, first_chunk)
                order = tf.random.experimental.stateless_shuffle(tf.range(count), seed=seed)
                rows = tf.gather(tf.math.invert_permutation(order), rows)  # row r leaves as row order⁻¹[r]
            values = {key: parts[key] for key in written}
            out = packing.write_rows(values, items, {key: lengths[key] for key in written}, rows, counted=counted,
                                     counted_values=named)
            del out[packing.ROW_EXAMPLES]
            if pair is not None:
                out = carried_weights.unfold(out, pair, spec)
            return {**out, **position_fields(example, first_chunk, tf.range(count))}

        # A pool's chunks in one element (their tokens where they were parsed): no per-window element, and
        # no batch of windows that would copy their tokens.
        pools = window_stream(chunks, written, self.window * windows).map(pool, name="pack", **parallel)
        if skip:  # the rows of the first pool delivered before (a resume)
            def skipped(left: tf.Tensor, rows: Features) -> tuple[tf.Tensor, Features]:
                dropped = tf.minimum(left, tf.shape(rows[keys[0]], out_type=tf.int64)[0])
                return left - dropped, {key: value[dropped:] for key, value in rows.items()}

            pools = pools.scan(tf.constant(skip, tf.int64), skipped)
        # One row an element for whatever follows, but a Batch right after cuts the pools (`rows_in_blocks`).
        return rows_in_blocks(pools)


def bucket_batches(bucket_lengths: Sequence[int], global_batch_size: int, context: tf.distribute.InputContext,
                   scale: str = "examples") -> list[int]:
    """The per-replica batch of each bucket. 'examples': the same in every bucket; 'tokens': scaled by
    longest / bucket length, rounded down to a multiple of 8 (never below the 'examples' batch)."""
    base = per_replica_batch_size(global_batch_size, context)
    if scale == "examples":
        return [base] * len(bucket_lengths)
    longest = bucket_lengths[-1]
    return [max(base, (base * longest // length) // 8 * 8) for length in bucket_lengths]


@dataclasses.dataclass(frozen=True)
class Bucket(Windowed):
    """Bucketing by length over a window: each emitted per-replica batch holds examples of one bucket,
    padded to that bucket's length (with `<key>_mask`), and each bucket's batches come in groups of
    `replicas` (the replicas one input pipeline feeds per step), so every replica of a step gets the
    same shape. The last group of a bucket is filled with padding examples (`example_mask` 0, token
    masks 0): no example is dropped or repeated, and a bucket has one shape (one XLA compile).

    Within a window, groups are emitted in bucket order (shortest first); the window's examples keep
    their stream order inside a bucket.
    """

    roles: ClassVar[tuple[str, ...]] = ("windowed", "batch")  # its windows leave as the step's batches
    mode_name: ClassVar[str] = "bucket"
    lengths: Mapping[str, int] = dataclasses.field(default_factory=dict)
    bucket_lengths: Sequence[int] = ()
    global_batch_size: int = 1
    overflow: str = "error"
    scale: str = "examples"

    def replicas(self, context: tf.distribute.InputContext) -> int:
        return max(1, context.num_replicas_in_sync // max(1, context.num_input_pipelines))

    def place(self, windows: tf.data.Dataset, context: tf.distribute.InputContext, first: int = 0,
              skipped: int = 0) -> tf.data.Dataset:
        """Each window's outputs, numbered; the first window (`first`) without its first `skipped` examples in
        bucket order (a window resumed on another slice: they were delivered in the old slice's groups), its
        outputs' positions carrying that count as their chunk."""
        def one_window(index: tf.Tensor, features: Features) -> tf.data.Dataset:
            done = tf.where(tf.equal(index, first), tf.constant(skipped, tf.int64), 0)
            outputs = self.outputs(features, context, done).enumerate()
            return outputs.map(lambda i, out: {**out, **position_fields(index * self.window, done, i)})

        return windows.flat_map(one_window)

    def bucket_of(self, window: Features) -> tf.Tensor:
        """int64 [W]: each example's bucket (the first whose length holds it)."""
        bounds = tf.constant(list(self.bucket_lengths), tf.int64)
        longest = int(self.bucket_lengths[-1])
        lengths = tf.reduce_max(tf.stack([tf.cast(window[key].row_lengths(), tf.int64) for key in self.keys]), axis=0)
        if self.overflow == "error":
            key = self.keys[0] if len(self.keys) == 1 else "/".join(self.keys)
            check = tf.debugging.assert_less_equal(lengths, tf.constant(longest, tf.int64),
                                                   message=overflow_message(key, longest))
            with tf.control_dependencies([check]):
                lengths = tf.identity(lengths)
        return tf.minimum(tf.searchsorted(bounds, lengths, side="left"), len(self.bucket_lengths) - 1)

    def group_sizes(self, context: tf.distribute.InputContext) -> list[int]:
        """Examples of each bucket a step's group holds: its per-replica batch × the replicas of a step."""
        sizes = bucket_batches(self.bucket_lengths, self.global_batch_size, context, self.scale)
        return [size * self.replicas(context) for size in sizes]

    def outputs(self, window: Features, context: tf.distribute.InputContext,
                skipped: tf.Tensor | int = 0) -> tf.data.Dataset:
        sizes = bucket_batches(self.bucket_lengths, self.global_batch_size, context, self.scale)
        group = self.replicas(context)
        bucket = self.bucket_of(window)
        per_bucket, before = [], tf.constant(0, tf.int64)
        for index, (length, size) in enumerate(zip(self.bucket_lengths, sizes)):
            members = tf.reshape(tf.where(tf.equal(bucket, index)), [-1])
            count = tf.size(members, tf.int64)
            members = members[tf.clip_by_value(skipped - before, 0, count):]  # delivered on an earlier slice
            before += count
            per_bucket.append(self._batches(window, members, int(length), size, group))
        batches = per_bucket[0]
        for more in per_bucket[1:]:
            batches = batches.concatenate(more)
        return batches

    def _batches(self, window: Features, members: tf.Tensor, length: int, size: int, group: int) -> tf.data.Dataset:
        """This bucket's examples of the window, in per-replica batches of `size`, groups of `group`."""
        count = tf.size(members, tf.int64)
        per_group = size * group
        num_batches = (count + per_group - 1) // per_group * group

        def batch(index: tf.Tensor) -> Features:
            slots = index * size + tf.range(size, dtype=index.dtype)  # static [size]: every feature's batch is static
            real = slots < count
            picked = tf.gather(members, tf.minimum(slots, tf.maximum(count - 1, 0)))
            out: Features = {EXAMPLE_MASK: tf.cast(real, tf.int32)}
            for name, value in window.items():
                if name in self.keys:
                    rows = tf.gather(value, picked)[:, :length].to_tensor(shape=[size, length])
                    mask = tf.sequence_mask(tf.minimum(tf.gather(value.row_lengths(), picked), length), length, tf.int32)
                    mask *= tf.cast(real, tf.int32)[:, tf.newaxis]
                    out[name] = rows * tf.cast(mask, rows.dtype) if rows.dtype.is_integer else rows
                    out[f"{name}_mask"] = mask
                else:
                    kept = tf.gather(value, picked)
                    out[name] = tf.where(tf.reshape(real, [-1] + [1] * (kept.shape.rank - 1)), kept, tf.zeros_like(kept))
            return out

        return tf.data.Dataset.range(num_batches).map(batch)
