"""Variable-length token features into static shapes: pad each example, or bucket a window of them.

(Packing, several examples per row, is `tpu_pipeline.pipeline.packing`; the windowing and the
resume position that bucket and pack share are here.)

    PadTo({"tokens": 128})                       # [128] per example, plus tokens_mask
    Bucket({"tokens": 1024}, [128, 256, 512, 1024], global_batch_size=64, window=4096)

Windowed stages (bucket, pack) take `window` consecutive examples of the stream, place them, and
emit their outputs; each output carries `_window` (the window's index in the stream) and `_index`
(its place among the window's outputs). Window w starts at example w × window, so a resume needs
only (w, outputs of w delivered): `Windowed.apply(start_window=w, skip=k)` rebuilds from there.
Token id 0 is a real token: a mask (pad, bucket) or a segment id (pack) marks padding, never a value.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.stages import per_replica_batch_size

Features = dict[str, Any]
WINDOW_KEY, INDEX_KEY = "_window", "_index"  # the resume position every windowed output carries
META_KEYS = (WINDOW_KEY, INDEX_KEY)
EXAMPLE_MASK = "example_mask"  # bucket mode: 1 for a real example, 0 for a padding one (an empty example is real)


def overflow_message(key: str, length: int, mode: str) -> str:
    fix = "truncate (or split)" if mode == "pack" else "truncate"
    return (f"data.sequence: an example of {key} is longer than length {length}; set "
            f"data.sequence.overflow: {fix}, raise data.sequence.length, or cut it with a truncate op")


def fit_length(tokens: tf.Tensor, key: str, length: int, overflow: str, mode: str) -> tf.Tensor:
    """`tokens` (1-D) cut to `length` (overflow 'truncate'), or checked to fit ('error')."""
    if overflow == "error":
        check = tf.debugging.assert_less_equal(tf.size(tokens), length, message=overflow_message(key, length, mode))
        with tf.control_dependencies([check]):
            return tf.identity(tokens)
    return tokens[:length]


def pad_example(features: Features, lengths: Mapping[str, int], overflow: str = "error") -> Features:
    """One example with each key of `lengths` cut or padded to its length, and `<key>_mask` (int32,
    1 on real tokens) beside it. Padding values are 0; only the mask tells padding."""
    out = dict(features)
    for key, length in lengths.items():
        tokens = fit_length(_one_d(features, key), key, length, overflow, "pad")
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


@dataclasses.dataclass(frozen=True)
class PadTo:
    """Stage: every example's keys padded (or cut) to their lengths, with masks. Per example, so it
    is usually fused into the preprocessing map (`pad_example`); the stage is for use alone."""

    lengths: Mapping[str, int]
    overflow: str = "error"

    def apply(self, dataset: tf.data.Dataset, context: tf.distribute.InputContext) -> tf.data.Dataset:
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
class Windowed:
    """Base of bucket and pack: windows of examples → each window's outputs, numbered for resume.

    A subclass gives `outputs(window_features, context) -> dataset` of that window's outputs.
    `start_window`: the index of the first window (a resumed stream's); `skip`: outputs of that
    first window already delivered.
    """

    keys: Sequence[str]
    window: int

    def outputs(self, window: Features, context: tf.distribute.InputContext) -> tf.data.Dataset:
        raise NotImplementedError

    def check_features(self, spec: Mapping[str, Any]) -> None:
        for key in self.keys:
            if key not in spec:
                raise ConfigError(f"data.sequence.keys: feature {key!r} does not exist; features here: {sorted(spec)}")

    def apply(self, dataset: tf.data.Dataset, context: tf.distribute.InputContext, start_window: int = 0,
              skip: int = 0) -> tf.data.Dataset:
        self.check_features(dataset.element_spec)
        windows = window_of(dataset, self.window, self.keys)
        numbered = tf.data.Dataset.zip((tf.data.Dataset.range(start_window, 1 << 62), windows))

        def one_window(index: tf.Tensor, features: Features) -> tf.data.Dataset:
            outputs = self.outputs(features, context).enumerate()
            return outputs.map(lambda i, out: {**out, WINDOW_KEY: index, INDEX_KEY: i})

        placed = numbered.flat_map(one_window)
        return placed.skip(skip) if skip else placed


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

    lengths: Mapping[str, int] = dataclasses.field(default_factory=dict)
    bucket_lengths: Sequence[int] = ()
    global_batch_size: int = 1
    overflow: str = "error"
    scale: str = "examples"

    def replicas(self, context: tf.distribute.InputContext) -> int:
        return max(1, context.num_replicas_in_sync // max(1, context.num_input_pipelines))

    def outputs(self, window: Features, context: tf.distribute.InputContext) -> tf.data.Dataset:
        bounds = tf.constant(list(self.bucket_lengths), tf.int64)
        sizes = bucket_batches(self.bucket_lengths, self.global_batch_size, context, self.scale)
        group = self.replicas(context)
        longest = int(self.bucket_lengths[-1])
        lengths = tf.reduce_max(tf.stack([tf.cast(window[key].row_lengths(), tf.int64) for key in self.keys]), axis=0)
        if self.overflow == "error":
            key = self.keys[0] if len(self.keys) == 1 else "/".join(self.keys)
            check = tf.debugging.assert_less_equal(lengths, tf.constant(longest, tf.int64),
                                                   message=overflow_message(key, longest, "bucket"))
            with tf.control_dependencies([check]):
                lengths = tf.identity(lengths)
        bucket = tf.minimum(tf.searchsorted(bounds, lengths, side="left"), len(self.bucket_lengths) - 1)
        per_bucket = []
        for index, (length, size) in enumerate(zip(self.bucket_lengths, sizes)):
            members = tf.reshape(tf.where(tf.equal(bucket, index)), [-1])
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
            slots = tf.range(index * size, (index + 1) * size)
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


def strip_meta(features: Features) -> tuple[Features, Features]:
    """(the features without the resume position, the position)."""
    return ({k: v for k, v in features.items() if k not in META_KEYS},
            {k: features[k] for k in META_KEYS if k in features})
