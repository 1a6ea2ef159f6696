"""The packer's placement where this TensorFlow has no XLA for the CPU (the TPU build): the rows XLA's loop
gives, from loops made for TF's executor.

XLA compiles `placement._place_loop` (a step an item) into a native loop. TF's executor runs each op of a
loop step on its own, and an op costs about a microsecond whatever its size, the loop's own
Enter/Merge/Switch nodes included: ~15-20 µs an item at a window of 1,024. Two loops here cut the ops:

- **A step per run of equal items** (`_place_runs`). The decreasing orders sort items by size, so a
  window of integer token counts holds few distinct sizes (a window of 1,024 short documents: ~50; of
  documents of 3-256 tokens: ~250). Equal items go where the item-by-item loop would put them one after
  another, computed at once: first fit fills the rows in row order, each taking as many as fit
  (min over keys of room // size) before the next row takes any; best fit fills them in order of
  combined room left (ties to the lowest row), for a row that took one stays the tightest fit until it
  is full. A cumulative sum of those counts and one `searchsorted` give every item its row.
- **Several items a step** (`_place_unrolled`) where sizes seldom repeat (the long tail of a decreasing
  order, or `first_fit` in window order): the same search as XLA's loop, `UNROLLED` items a loop step,
  with the fewest ops an item, and one TensorArray write a step instead of a scatter per item.

`_place_split` first puts the items that each open a row (`_openers`) in their rows at once, then runs
the second loop up to the item where the first becomes cheaper, and the first after it, the room carried
from one part to the next. Either gives XLA's rows exactly (tests/test_packing.py compares
them on every algorithm), so a run resumes across TensorFlow builds (tests/test_same_batches.py runs under
both).
"""
from __future__ import annotations

import tensorflow as tf

INT64_MAX = (1 << 63) - 1
UNROLLED = 16
# A run's step costs about as much as this many items of the unrolled loop (measured under .venv-tpu:
# `benchmarks/bench_packing.py --alone`).
RUN_STEP_IN_ITEMS = 3


def place_without_xla(sizes: tf.Tensor, room: tf.Tensor, weights: tf.Tensor,
                      best_fit: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """Row of each item of `sizes` [N, K] (placement order) in `room` [rows, K] (every row empty, enough
    of them, one to spare), and whether every item fitted (it always should)."""
    return _place_graph(sizes, room, weights, best_fit)


def _place_split(sizes: tf.Tensor, room: tf.Tensor, weights: tf.Tensor, best_fit: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """The window in three parts: the items that open a row each (`_openers`) at once, then the unrolled
    loop up to a split item, then the runs loop from that item (a run's start) to the end.

    In a decreasing order the sizes that seldom repeat come first (the long tail) and the long runs of
    equal items last, so the split is put where the two loops' steps cost least in all, counted in
    items of the unrolled loop. Every part is exact, so where the parts meet changes no row."""
    limits = room[0]  # the room starts empty: every row is the limits
    openers = _openers(sizes, limits)
    rest = sizes[openers:]
    # Rows the rest can open (`row_bound`'s argument holds among them), and one to spare: fewer rows to search.
    rest_rows = row_bound(rest, limits) + 1
    room = tf.concat([room[:1] - sizes[:openers], room[openers:openers + rest_rows]], 0)
    count = tf.shape(rest)[0]
    starts = _run_starts(rest)
    runs_from = tf.range(tf.shape(starts)[0], 0, -1)  # runs left from each run's start to the end
    cost = tf.concat([starts + runs_from * RUN_STEP_IN_ITEMS, count[None]], 0)  # the last: no split
    best = tf.cast(tf.argmin(cost), tf.int32)  # any of equal costs: the rows are the same
    split = tf.concat([starts, count[None]], 0)[best]
    head, room = _place_unrolled(rest[:split], room, weights, best_fit)
    tail, room = _place_runs(rest[split:], starts[best:] - split, room, weights, best_fit)
    rows = tf.concat([tf.range(openers), head, tail], 0)
    every_item_placed = tf.reduce_max(tf.concat([rows, [0]], 0)) < tf.shape(room)[0]
    return rows, (tf.reduce_min(room) >= 0) & every_item_placed


def _openers(sizes: tf.Tensor, limits: tf.Tensor) -> tf.Tensor:
    """How many first items each open a row of their own, under any of the algorithms: the longest prefix
    whose items are all over half a row in one same key (no two of them share a row, so each fits no row
    opened before it and takes the first empty one). In a decreasing order of one key: every item over
    half a row (a window of documents of 3-256 tokens in rows of 256: about half its items)."""
    over_half = 2 * sizes > limits  # [N, K]
    count = tf.shape(sizes)[0]
    first_not = tf.reduce_min(tf.where(over_half, count, tf.range(count)[:, None]), axis=0)  # [K]
    return tf.minimum(tf.reduce_max(tf.concat([first_not, [0]], 0)), count)  # an empty window: 0


def row_bound(sizes: tf.Tensor, limits: tf.Tensor) -> tf.Tensor:
    """Rows any first-fit or best-fit packing of `sizes` [N, K] can use: at most
    min(N, 1 + sum_k floor(2 * tokens_k / length_k)).

    Why: a row opens only when its first item fits no open row, so of two rows, the later one is
    over half full in some key; hence at most one row is at most half full in every key, and no
    more than 2 * tokens_k / length_k rows are over half full in key k. For short sequences this
    is far fewer rows than items (~4x at a median of 12 tokens in rows of 128): a smaller search.
    """
    halves = tf.reduce_sum(2 * tf.reduce_sum(sizes, axis=0) // limits)
    return tf.minimum(tf.shape(sizes)[0], 1 + halves)


def _run_starts(sizes: tf.Tensor) -> tf.Tensor:
    """Index of the first item of each run of equal items (at least one run, empty windows too)."""
    differs = tf.reduce_any(sizes[1:] != sizes[:-1], axis=1)
    return tf.cast(tf.where(tf.concat([[True], differs], 0))[:, 0], tf.int32)


def _place_runs(sizes: tf.Tensor, starts: tf.Tensor, room: tf.Tensor, weights: tf.Tensor,
                best_fit: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """A loop step per run of equal items (`starts`): every item of the run placed at once. Their rows (an
    item that fitted nowhere: `capacity`), and the room left."""
    runs = tf.shape(starts)[0]
    lengths = tf.concat([starts[1:], tf.shape(sizes)[:1]], 0) - starts
    capacity = tf.shape(room)[0]
    index = tf.range(tf.cast(capacity, tf.int64))
    past_the_rows = capacity[None]

    def step(g: tf.Tensor, room: tf.Tensor, rows: tf.TensorArray) -> tuple[tf.Tensor, tf.Tensor, tf.TensorArray]:
        need, count = sizes[starts[g]], lengths[g]  # [K], items in the run
        per_row = tf.minimum(tf.reduce_min(tf.where(need > 0, room // tf.maximum(need, 1), count), axis=1), count)
        if best_fit:  # rows by combined room left, ties to the lowest row; rows with no room last
            left = tf.reduce_sum(tf.cast(room - need, tf.int64) * weights, axis=1)
            order = tf.argsort(tf.where(per_row > 0, left * tf.cast(capacity, tf.int64) + index, INT64_MAX),
                               stable=True)
            per_row = tf.gather(per_row, order)
        filled = tf.cumsum(per_row)
        rows_of_items = tf.searchsorted(filled, tf.range(count), side="right")  # an item past every row: `capacity`
        taken = tf.minimum(per_row, tf.maximum(count - (filled - per_row), 0))
        if best_fit:
            rows_of_items = tf.gather(tf.concat([tf.cast(order, tf.int32), past_the_rows], 0), rows_of_items)
            taken = tf.scatter_nd(order[:, None], taken, [capacity])
        room = room - taken[:, None] * need[None, :]
        return g + 1, room, rows.write(g, rows_of_items)

    rows = tf.TensorArray(tf.int32, size=runs, infer_shape=False, element_shape=[None])
    _, room, rows = tf.while_loop(lambda g, *_: g < runs, step, (tf.constant(0), room, rows))
    return rows.concat(), room


def _place_unrolled(sizes: tf.Tensor, room: tf.Tensor, weights: tf.Tensor,
                    best_fit: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """XLA's item-by-item loop, `UNROLLED` items a step: the items' rows and the room left (an item that
    fits nowhere, which the row bound rules out: best fit leaves a negative room, first fit's scatter fails). Items of size 0 pad the window past its last step (they fit any
    row and take no room; their rows are dropped)."""
    count = tf.shape(sizes)[0]
    steps = (count + UNROLLED - 1) // UNROLLED
    # A whole spare step of padding: an empty window would otherwise slice an empty tensor.
    needs = tf.pad(sizes, [[0, steps * UNROLLED - count + UNROLLED], [0, 0]])[:, None, :]  # [items, 1, K]
    one_key = sizes.shape[1] == 1  # known at trace time (unknown where reduce_retracing relaxed it: the general ops)
    capacity = tf.cast(tf.shape(room)[0], tf.int64)
    index = tf.range(capacity)[:, None]  # [rows, 1]

    def step(j: tf.Tensor, room: tf.Tensor, rows: tf.TensorArray) -> tuple[tf.Tensor, tf.Tensor, tf.TensorArray]:
        placed = []
        for offset in range(UNROLLED):
            need = needs[j * UNROLLED + offset]  # [1, K]: already the scatter's update
            fits = room >= need
            if not one_key:
                fits = tf.reduce_all(fits, axis=1, keepdims=True)
            if best_fit:
                left = tf.cast(room - need, tf.int64)
                if not one_key:  # one key: its weight scales every row alike, and the order stays
                    left = tf.reduce_sum(left * weights, axis=1, keepdims=True)
                row = tf.reduce_min(tf.where(fits, left * capacity + index, INT64_MAX), axis=0, keepdims=True) % capacity
            else:
                row = tf.reduce_min(tf.where(fits, index, INT64_MAX), axis=0, keepdims=True)
            room = tf.tensor_scatter_nd_sub(room, row, need)  # row [1, 1]
            placed.append(row)
        return j + 1, room, rows.write(j, tf.cast(tf.concat(placed, axis=0), tf.int32))

    rows = tf.TensorArray(tf.int32, size=steps, element_shape=[UNROLLED, 1])
    _, room, rows = tf.while_loop(lambda j, *_: j < steps, step, (tf.constant(0), room, rows))
    return tf.reshape(rows.stack(), [-1])[:count], room


_place_graph = tf.function(_place_split, reduce_retracing=True, autograph=False)
