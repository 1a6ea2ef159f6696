"""A token's loss weight carried inside its target's int64 through the packer, so a weighted row costs about
what an unweighted one does.

Why: the packer's cost is per key (chunk, window and write each key's values), and `loss_weights` is one weight
per target, aligned with it token for token, 0 or 1. Packed as a key of its own it cost a fifth of the tokens/s
(issue 50). So each target is `2 · target + weight` (ops/weighted_values.py) through the chunks, windows and rows,
and is taken apart in the rows (a shift and a mask: exact for any token id below 2⁶² in magnitude; the outputs
hold int32 ids anyway). `lm_shift` hands its targets on that way already, as `weighted_targets`
(`config.data.weighted_key`); targets and weights given as two keys are folded here. The placement still sees the
weights' column (a copy of the targets' counts), so the rows are the ones the two keys gave: byte for byte, in
the same order. Pad and bucket mode take the two apart first (`apart`): their rows hold each key anyway.

    spec = as_two_keys(spec, keys)             # what the checks see: targets and loss_weights, as the rows have
    pair = carried_pair(keys, lengths, spec)   # (weights key, target key), or None: packed as before
    folded = fold(features, pair)              # before chunk_stream: the weights key is gone
    rows = unfold(rows, pair, spec)            # after write_rows: both keys (the weights' slots are the target's)

A weight whose count differs from its target's in an example, or one other than 0 or 1, stops the run with one
line naming the features (packed apart, the rows would have paired weights with other tokens silently).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import tensorflow as tf

from tpu_pipeline.config.data import LOSS_WEIGHTS, weighted_key, weighted_target
from tpu_pipeline.ops import weighted_values


def _values_dtype(spec: Any) -> Optional[tf.DType]:
    return spec.dtype if isinstance(spec, (tf.TensorSpec, tf.RaggedTensorSpec)) else None


def _carried_by(keys: Sequence[str], features: Mapping[str, Any]) -> Optional[tuple[str, str]]:
    """(the target key, the key that carries it and its weights) when the element holds the targets folded
    (`weighted_targets`, from `lm_shift`) and the sequence keys ask for both; else None."""
    target = weighted_target(keys)
    if target is None or LOSS_WEIGHTS not in keys or weighted_key(target) not in features:
        return None
    return target, weighted_key(target)


def as_two_keys(spec: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The element spec as the checks and the rows see it: folded targets as `targets` and `loss_weights`."""
    carried = _carried_by(keys, spec)
    if carried is None:
        return dict(spec)
    target, key = carried
    out = {name: value for name, value in spec.items() if name != key}
    return {**out, target: spec[key], LOSS_WEIGHTS: spec[key]}


def _values(value: Any, fn: Any) -> Any:
    return value.with_flat_values(fn(value.flat_values)) if isinstance(value, tf.RaggedTensor) else fn(value)


def apart(features: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """Folded targets (`weighted_targets`) as two keys again, `targets` and `loss_weights` (pad and bucket mode,
    whose rows hold each key); any other element as it is."""
    carried = _carried_by(keys, features)
    if carried is None:
        return dict(features)
    target, key = carried
    out = {name: value for name, value in features.items() if name != key}
    out[target] = _values(features[key], weighted_values.ids_of)
    out[LOSS_WEIGHTS] = _values(features[key], weighted_values.weights_of)
    return out


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
    return weighted_values.fold(tokens, weights, pair[0], pair[1], "data.sequence: ")


def fold(features: Mapping[str, Any], pair: tuple[str, str]) -> dict[str, Any]:
    """The element without the weights key, each target carrying its weight (one example, or a ragged block);
    targets `lm_shift` folded already (`weighted_targets`) only change their name."""
    weights_key, target = pair
    if weighted_key(target) in features:
        out = {key: value for key, value in features.items() if key != weighted_key(target)}
        return {**out, target: features[weighted_key(target)]}
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
    out[target] = tf.cast(weighted_values.ids_of(carried), _values_dtype(spec[target]))  # floor(c / 2)
    out[weights_key] = tf.cast(weighted_values.weights_of(carried), _values_dtype(spec[weights_key]))
    return out
