"""Token ids and their 0/1 loss weights in one int64 each: `2 * id + weight`.

Why: every stage after `lm_shift` (cut, chunk, window, write a row) costs per key, and a weight is one value per
token, aligned with it. Carried inside the token it costs a shift and a mask at the ends instead of a second key
through all of them (issue 50: packing with weights kept 0.93 of the unweighted tokens/s this way, against 0.76 as
a key of its own; benchmarks/README.md "Weights inside the tokens"). Exact for any id of magnitude below 2⁶²
(2³⁰ in int32).

    values = fold(ids, weights, "loss_weights", "targets", "op 'lm_shift': ")   # checks each weight is 0 or 1
    ids, weights = ids_of(values), weights_of(values)
"""
from __future__ import annotations

import tensorflow as tf


def fold(ids: tf.Tensor, weights: tf.Tensor, weights_name: str, ids_name: str, where: str = "") -> tf.Tensor:
    """`2 * id + weight` in the ids' dtype (int32 ids of a parse that narrowed them stay int32: ids below 2³⁰), after
    checking (when it runs) that every weight is 0 or 1."""
    weights = tf.cast(weights, tf.int64)
    # Seen as unsigned, a weight is 0 or 1 exactly when it is at most 1 (a negative one is huge): one pass, no copy
    # (and 0 for no weight at all).
    largest = tf.reduce_max(tf.bitcast(weights, tf.uint64))
    check = tf.debugging.Assert(largest <= 1, [
        f"{where}feature '{weights_name}' holds a weight other than 0 or 1 (loss weights are 1 on the tokens to "
        f"learn, 0 elsewhere; each is carried inside its token of '{ids_name}'): fix the records, `tpu-pipeline "
        "verify` names them"])
    with tf.control_dependencies([check]):
        return ids * 2 + tf.cast(weights, ids.dtype)


def ids_of(values: tf.Tensor) -> tf.Tensor:
    """The ids of folded values: `floor(value / 2)`."""
    return tf.bitwise.right_shift(values, tf.constant(1, values.dtype))


def weights_of(values: tf.Tensor) -> tf.Tensor:
    """The 0/1 weights of folded values."""
    return tf.bitwise.bitwise_and(values, tf.constant(1, values.dtype))
