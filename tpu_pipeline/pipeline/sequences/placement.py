"""Which row each item of a packing window goes to: first fit or best fit, decreasing or in order.

The one sequential part of packing (tpu_pipeline.pipeline.sequences.packing): a `tf.while_loop` over the
window's items, each step one vectorized search of the remaining room of every row, compiled by XLA.
Where this TensorFlow has no XLA for the CPU (the TPU build), `placement_without_xla` gives the same rows
with loops made for TF's executor. Deterministic:
sizes combine with integer weights, and ties go to the lowest row by encoding the row index into the
minimized key, never by argmin's order.
"""
from __future__ import annotations

import functools
import logging
import math

import tensorflow as tf

from tpu_pipeline.pipeline.sequences.placement_without_xla import INT64_MAX as _INT64_MAX
from tpu_pipeline.pipeline.sequences.placement_without_xla import place_without_xla, row_bound as _row_bound
log = logging.getLogger(__name__)


def size_weights(limits: list[int]) -> list[int]:
    """Integer weights that make `sum_k size_k * weight_k` proportional to `sum_k size_k / length_k`.

    The combined size of an example over several keys is the sum of the fractions of each key's row
    it fills (for one key: its length). Integers (weight_k = lcm / length_k) keep the sort and the
    best-fit choice exact, hence deterministic and reproducible by a reference in Python. Best fit
    multiplies a combined room by the row capacity (< 2**31), so when the lcm is too large for that
    to fit in int64 the weights fall back to 1 (the plain sum of tokens).
    """
    lcm = math.lcm(*limits)
    if lcm * len(limits) >= 1 << 31:
        return [1] * len(limits)
    return [lcm // limit for limit in limits]


def placement_order(sizes: tf.Tensor, weights: list[int], decreasing: bool) -> tf.Tensor:
    """Placement order: window order, or a stable sort by combined size, largest first."""
    count = tf.shape(sizes)[0]
    if not decreasing:
        return tf.range(count)
    combined = tf.reduce_sum(tf.cast(sizes, tf.int64) * tf.constant(weights, tf.int64), axis=1)
    return tf.math.top_k(combined, k=count, sorted=True).indices  # top_k keeps the lower index first on ties


def _place_loop(sizes: tf.Tensor, count: tf.Tensor, room: tf.Tensor, weights: tf.Tensor,
                best_fit: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """Row of each of the first `count` items of `sizes` [items, K], in placement order: first fit
    (the lowest row with room in every key) or best fit (the fitting row with the least combined
    room left after it; ties to the lowest row). Entries past `count` stay 0. Also whether every item
    fitted (it always should).

    `room` [rows, K] (every row empty: each key's length) has enough rows for any such packing
    (`_row_bound`) and is searched whole at every step: one vectorized compare per item instead of
    a loop over rows. Ties are broken by encoding the row index into the minimized key, never by
    argmin/argmax (whose tie order TF does not promise).
    """
    capacity = tf.cast(tf.shape(room)[0], tf.int64)
    index = tf.range(capacity)
    rows = tf.zeros([tf.shape(sizes)[0]], tf.int32)

    def step(i: tf.Tensor, room: tf.Tensor, rows: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        need = sizes[i]
        fits = tf.reduce_all(room >= need, axis=1)
        if best_fit:
            left = tf.reduce_sum(tf.cast(room - need, tf.int64) * weights, axis=1)
            key = tf.where(fits, left * capacity + index, _INT64_MAX)
        else:
            key = tf.where(fits, index, _INT64_MAX)
        row = tf.cast(tf.reduce_min(key) % capacity, tf.int32)
        room = tf.tensor_scatter_nd_sub(room, row[None, None], need[None])
        return i + 1, room, tf.tensor_scatter_nd_update(rows, i[None, None], row[None])

    _, room, rows = tf.while_loop(lambda i, *_: i < count, step, (tf.constant(0), room, rows))
    return rows, tf.reduce_min(room) >= 0  # an item put where it did not fit leaves a negative room


# The placement loop is the only sequential part: XLA compiles it to a native loop. The whole of
# `pack_window` costs ~1.2-3.3 µs an item at a window of 1024 that way, ~15-20 µs when TF's executor runs
# this loop op by op (`benchmarks/bench_packing.py --alone --windows 1024`): hence placement_without_xla.
# XLA needs static shapes, so items and rows are padded to powers of two: a few compiles a process.
_place_jit = tf.function(_place_loop, jit_compile=True, reduce_retracing=True, autograph=False)


@functools.lru_cache(maxsize=None)
def xla_on_cpu() -> bool:
    """Whether this TensorFlow can compile for the host CPU with XLA (asked once a process).

    The TPU build (tensorflow-tpu 2.19) links no XLA CPU backend: a `jit_compile` function on the CPU
    raises "could not find registered transfer manager for platform Host". There the placement runs on
    TF's executor instead (`placement_without_xla`): the same rows (benchmarks/bench_packing.py measures both).
    """
    with tf.init_scope(), tf.device("/CPU:0"):
        try:
            tf.function(lambda x: x + 1, jit_compile=True, autograph=False)(tf.constant(0))
            return True
        except (tf.errors.NotFoundError, tf.errors.UnimplementedError, tf.errors.InvalidArgumentError) as error:
            log.info("packing: no XLA for the CPU in this TensorFlow (%s); the placement runs on TF's executor",
                     str(error).splitlines()[0][:120])
            return False


def _power_of_two(count: tf.Tensor) -> tf.Tensor:
    """The smallest power of two >= max(count, 16): few distinct shapes for XLA to compile."""
    x = tf.maximum(count, 16) - 1
    for shift in (1, 2, 4, 8, 16):
        x = tf.bitwise.bitwise_or(x, tf.bitwise.right_shift(x, shift))
    return x + 1


def place(sizes: tf.Tensor, limits: tf.Tensor, weights: tf.Tensor, best_fit: bool, jit: bool) -> tf.Tensor:
    """Row of each item of `sizes` [N, K] (placement order)."""
    count = tf.shape(sizes)[0]
    if jit and xla_on_cpu():
        padded = tf.pad(sizes, [[0, _power_of_two(count) - count], [0, 0]])
        room = tf.tile(limits[None, :], [_power_of_two(_row_bound(sizes, limits)), 1])
        rows, fitted = _place_jit(padded, count, room, weights, best_fit)
    else:
        # A spare row: an empty window would give the scatters an empty input, which their shape inference
        # refuses even though the loop never runs.
        room = tf.tile(limits[None, :], [_row_bound(sizes, limits) + 1, 1])
        rows, fitted = place_without_xla(sizes, room, weights, best_fit)
    check = tf.debugging.Assert(fitted, ["packing: an item found no row within the row bound (a bug in packing.py)"])
    with tf.control_dependencies([check]):
        return tf.identity(rows[:count])
