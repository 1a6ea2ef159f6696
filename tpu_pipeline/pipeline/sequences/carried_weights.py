"""A token's loss weight carried inside its target's int64 through the packer, so a weighted row costs about
what an unweighted one does.

Why: the packer's cost is per key (chunk, window and write each key's values), and `loss_weights` is one weight
per target, aligned with it token for token, 0 or 1. Packed as a key of its own it cost a fifth of the tokens/s
(issue 50). So each target becomes `2 · target + weight` before the chunks are cut, and is taken apart in the
rows (a shift and a mask: exact for any token id below 2⁶² in magnitude; the outputs hold int32 ids anyway).
The placement still sees the weights' column (a copy of the targets' counts), so the rows are the ones the two
keys gave: byte for byte, in the same order.

    pair = carried_pair(keys, lengths, spec)   # (weights key, target key), or None: packed as before
    folded = fold(features, pair)              # before chunk_stream: the weights key is gone
    rows = unfold(rows, pair, spec)            # after write_rows: both keys (the weights' slots are the target's)

A weight whose count differs from its target's in an example, or one other than 0 or 1, stops the run with one
line naming the features (packed apart, the rows would have paired weights with other tokens silently).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import tensorflow as tf

from tpu_pipeline.config.data import LOSS_WEIGHTS, weighted_target


def _values_dtype(spec: Any) -> Optional[tf.DType]:
    return spec.dtype if isinstance(spec, (tf.TensorSpec, tf.RaggedTensorSpec)) else None


def carried_pair(keys: Sequence[str], lengths: Mapping[str, int], spec: Mapping[str, Any]) -> Optional[tuple[str, str]]:
    """(weights key, target key) when the weights can ride in the target: both integer keys of one row length,
    the same kind of tensor; else None."""
    target = weighted_target(keys)
    if LOSS_WEIGHTS not in keys or target is None or LOSS_WEIGHTS not in spec or target not in spec:
        return None
    if lengths.get(LOSS_WEIGHTS) != lengths.get(target):
        return None
    weights, tokens = spec[LOSS_WEIGHTS], spec[target]
    integer = all(_values_dtype(s) in (tf.int32, tf.int64) for s in (weights, tokens))
    if not integer or type(weights) is not type(tokens) or weights.shape.rank != tokens.shape.rank:
        return None
    return LOSS_WEIGHTS, target


def _folded_values(tokens: tf.Tensor, weights: tf.Tensor, pair: tuple[str, str]) -> tf.Tensor:
    tokens, weights = tf.cast(tokens, tf.int64), tf.cast(weights, tf.int64)
    # Seen as unsigned, a weight is 0 or 1 exactly when it is at most 1 (a negative one is huge): one pass, no copy
    # (and 0 for no weight at all).
    largest = tf.reduce_max(tf.bitcast(weights, tf.uint64))
    check = tf.debugging.Assert(largest <= 1, [
        f"data.sequence: feature '{pair[0]}' holds a weight other than 0 or 1 (loss weights are 1 on the tokens to "
        f"learn, 0 elsewhere; pack carries each inside its token of '{pair[1]}'): fix the records, `tpu-pipeline "
        "verify` names them"])
    with tf.control_dependencies([check]):
        return tokens * 2 + weights


def fold(features: Mapping[str, Any], pair: tuple[str, str]) -> dict[str, Any]:
    """The element without the weights key, each target carrying its weight (one example, or a ragged block)."""
    weights_key, target = pair
    tokens, weights = features[target], features[weights_key]
    out = {key: value for key, value in features.items() if key != weights_key}
    message = (f"data.sequence: feature '{weights_key}' must hold one weight per token of '{target}' (a different "
               "number in an example); write them together, one per token")
    if isinstance(tokens, tf.RaggedTensor):
        same = tf.debugging.assert_equal(tokens.row_splits, tf.cast(weights.row_splits, tokens.row_splits.dtype),
                                         message=message)
        with tf.control_dependencies([same]):
            out[target] = tokens.with_flat_values(_folded_values(tokens.flat_values, weights.flat_values, pair))
        return out
    same = tf.debugging.assert_equal(tf.size(tokens), tf.size(weights), message=message)
    with tf.control_dependencies([same]):
        out[target] = _folded_values(tokens, weights, pair)
    return out


def unfold(rows: Mapping[str, tf.Tensor], pair: tuple[str, str], spec: Mapping[str, Any]) -> dict[str, tf.Tensor]:
    """Packed rows with the target and its weights apart again, in their own dtypes. The weights get no segment ids
    or positions of their own: they would be the target's (the same slots), copied by every batch for nothing."""
    weights_key, target = pair
    out = dict(rows)
    carried = rows[target]
    out[target] = tf.cast(tf.bitwise.right_shift(carried, 1), _values_dtype(spec[target]))  # floor(c / 2)
    out[weights_key] = tf.cast(tf.bitwise.bitwise_and(carried, 1), _values_dtype(spec[weights_key]))
    return out
