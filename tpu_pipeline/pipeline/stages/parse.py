"""tf.Example and tf.SequenceExample parsing from the config's feature spec.

Feature kinds (config.data.FeatureConfig): `fixed` and `var` (densified, padded with `default`) give
dense tensors; `ragged` gives each example's 1-D vector at its own length (a `[B, None]`
RaggedTensor when a whole batch is parsed); `sequence` reads a SequenceExample feature list,
`[steps, *shape]` per example. Token ids stored as int64 (`ragged`, `sequence`) arrive as int32
unless the feature says `cast: int64`: TPUs take int32, and it halves the bytes behind every
later stage. An id outside int32 is an error naming the feature, never a wrapped value.

Nothing here pads a sequence: value 0 is a real token id, and a batch of sequences stays ragged
(the pad, bucket and pack stages decide the shape, and mark padding apart from the tokens).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Union

import tensorflow as tf

from tpu_pipeline.format.example_check import feature_spec, is_sequence_spec, sequence_spec

Value = Union[tf.Tensor, tf.RaggedTensor]


def _narrowed(features: Mapping[str, Any]) -> set[str]:
    """int64 features that arrive as int32 (ragged and sequence features, unless cast: int64)."""
    return {name for name, f in features.items()
            if f.dtype == "int64" and getattr(f, "parsed_dtype", "int64") == "int32"}


def to_int32(value: Value, name: str) -> Value:
    """int64 ids → int32, failing (tf.errors.InvalidArgumentError) on an id outside int32 instead of wrapping."""
    values = value.flat_values if isinstance(value, tf.RaggedTensor) else value
    narrow = tf.cast(values, tf.int32)
    fits = tf.reduce_all(tf.equal(tf.cast(narrow, tf.int64), values))
    check = tf.debugging.Assert(fits, [f"feature '{name}' holds a token id outside int32; set cast: int64 on "
                                       "the feature in data.features"])
    with tf.control_dependencies([check]):
        narrow = tf.identity(narrow)
    return value.with_flat_values(narrow) if isinstance(value, tf.RaggedTensor) else narrow


def make_parser(features: Mapping[str, Any], batched: bool = False) -> Callable[[tf.Tensor], dict[str, Value]]:
    """Returns fn(serialized) → dict of tensors, in the order of `features`.

    batched=True parses a whole vector of records with one call (`parse_example`, or
    `parse_sequence_example`); then `ragged` and `sequence` features are `[B, None, ...]` RaggedTensors.
    """
    features = dict(features)
    sequence = is_sequence_spec(features)
    spec = feature_spec(features)
    context_spec, list_spec = sequence_spec(features)
    defaults = {name: f.default for name, f in features.items()}
    narrowed = _narrowed(features)

    def parse_records(serialized: tf.Tensor) -> dict[str, Value]:
        if not sequence:
            return (tf.io.parse_example if batched else tf.io.parse_single_example)(serialized, spec)
        if not batched:
            context, lists = tf.io.parse_single_sequence_example(serialized, context_spec, list_spec)
            return {**context, **lists}
        context, lists, lengths = tf.io.parse_sequence_example(serialized, context_spec, list_spec)
        # A batch of feature lists comes padded with zeros to the longest; 0 is a real token id, so the
        # rows are cut back to their lengths (ragged, like a batch of `ragged` features).
        return {**context, **{name: tf.RaggedTensor.from_tensor(value, lengths=lengths[name])
                              for name, value in lists.items()}}

    def parse(serialized: tf.Tensor) -> dict[str, Value]:
        parsed = parse_records(serialized)
        out: dict[str, Value] = {}
        for name in features:
            value = parsed[name]
            if isinstance(value, tf.SparseTensor):
                default = defaults[name]
                value = tf.sparse.to_dense(value, default_value=default) if default is not None else tf.sparse.to_dense(value)
            out[name] = to_int32(value, name) if name in narrowed else value
        return out

    return parse
