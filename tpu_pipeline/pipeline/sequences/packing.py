"""Sequence packing: several variable-length examples in one fixed-length row, in TensorFlow ops.

A TPU compiles one program per shape, so variable-length token sequences are packed into rows of a
static `length`. Each packed key `k` becomes three `[R, length]` tensors:

- `k`: the tokens, padded with value 0 at the end of the row;
- `k_segment_ids` (int32): 1, 2, ... for the examples of the row in order, 0 for padding;
- `k_positions` (int32): 0-based position within its segment, restarting at every segment.

Padding is only ever identified by segment id 0: token 0 is a real token (unlike seqio's packer,
which counts non-zero tokens as the length).

The model is grain's first-fit packing over N bins, made deterministic and windowed: a window of W
consecutive examples is packed into as few rows as the algorithm finds, and the rows leave in row
order. Nothing crosses a window boundary, so the rows of a window are a pure function of its
examples: a resumable iterator needs only (examples consumed by finished windows, rows already
delivered from the current one) and replays at most one window (the `_row`/`_window_*` outputs).

Cost: placement (`placement.place`) is sequential per item: a `tf.while_loop` over the window's
items, each step one vectorized search of the remaining room of all rows, compiled by XLA (the whole of
`pack_window` ~1.2-3.3 µs an item). Where there is no XLA for the CPU (the TPU build),
`placement_without_xla` gives the same rows with loops made for TF's executor (equal sizes placed
together: ~2.7 µs an item on short documents, more where sizes seldom repeat: `bench_packing.py --alone`).
Everything else is
vectorized over the window, and the rows are written as one row-major stream per key
(`tf.ragged.range` + one `gather`, no scatter). See benchmarks/bench_packing.py and
benchmarks/README.md (issue 37).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence, Union

import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.core.tuning import tune
from tpu_pipeline.pipeline.sequences.placement import place, placement_order, size_weights
from tpu_pipeline.pipeline.stages.base import Stage, StageContext

ALGORITHMS = ("first_fit_decreasing", "best_fit_decreasing", "first_fit")
OVERFLOWS = ("truncate", "split", "error")

# Per-row metadata returned by `pack_window` next to the packed keys (drop every key starting with "_"):
ROW_EXAMPLES = "_row_examples"  # segments in the row (examples, or chunks of examples when overflow=split)
ROW = "_row"  # index of the row within its window: rows leave in this order
WINDOW_ROWS = "_window_rows"  # rows the window made: the row with _row == _window_rows - 1 ends it
WINDOW_EXAMPLES = "_window_examples"  # examples the window consumed (W, empty ones included)
METADATA = (ROW_EXAMPLES, ROW, WINDOW_ROWS, WINDOW_EXAMPLES)

def check_packing(lengths: Mapping[str, int], algorithm: str, overflow: str) -> None:
    """Refuses impossible packing arguments with a one-line ConfigError."""
    if not lengths:
        raise ConfigError("sequence.lengths is empty: name at least one feature to pack and its row length")
    for key, length in lengths.items():
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            raise ConfigError(f"sequence.lengths.{key}={length!r}: a row length must be a positive integer")
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"sequence.algorithm={algorithm!r} is unknown; use one of {', '.join(ALGORITHMS)}")
    if overflow not in OVERFLOWS:
        raise ConfigError(f"sequence.overflow={overflow!r} is unknown; use one of {', '.join(OVERFLOWS)}")


def _exclusive_cumsum(values: tf.Tensor) -> tf.Tensor:
    return tf.cumsum(values, axis=0, exclusive=True)


def expand_counts(counts: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """For `counts` [N] >= 0: (owner, rank) of each of the sum(counts) parts, parts numbered owner by
    owner: `tf.repeat(range(N), counts)` and the 0-based rank within its owner.

    In O(N + parts): `tf.repeat` builds an [N, max(counts)] mask, which for a window of long
    examples costs more than all the packing. An owner's first part is marked with a 1 (owners
    without parts add theirs to the next owner's mark) and a cumulative sum numbers the parts.
    """
    starts = _exclusive_cumsum(counts)
    total = tf.reduce_sum(counts)
    marks = tf.math.unsorted_segment_sum(tf.ones_like(counts), starts, total + 1)[:-1]
    owner = tf.cumsum(marks) - 1
    return owner, tf.range(total) - tf.gather(starts, owner)


def _check_lengths(key: str, counts: tf.Tensor, limit: int) -> Optional[tf.Operation]:  # None when eager
    """overflow=error: an InvalidArgumentError naming the key, the longest example and the limit."""
    padded = tf.concat([counts, [0]], 0)
    longest = tf.reduce_max(padded)
    message = tf.strings.join([  # no quotes: a failed Assert in a graph escapes them
        f"sequence.lengths.{key}={limit}, but example ", tf.strings.as_string(tf.argmax(padded, output_type=tf.int32)),
        " of a packing window has ", tf.strings.as_string(longest),
        " tokens (overflow=error): raise the length, or use overflow=truncate or split"])
    return tf.debugging.Assert(longest <= limit, [message])


def _items(counts: tf.Tensor, starts: tf.Tensor, limits: tf.Tensor,
           split: bool) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """What gets placed: (sizes [N, K], source starts [N, K], example [N]) in window order.

    An item is an example (its head, when truncating) or, with `split`, one chunk of it: chunk c
    holds tokens [c * length_k, (c + 1) * length_k) of every key k, so the keys' chunks stay aligned
    (the concat-then-split limit). An example with no token in any key makes no item: it has nothing
    to attend to, and a segment id that no token carries would break the 1..k numbering of a row.
    """
    if split:
        chunks = tf.reduce_max((counts + limits - 1) // limits, axis=1)
    else:
        chunks = tf.cast(tf.reduce_max(counts, axis=1) > 0, tf.int32)
    example, chunk = expand_counts(chunks)
    skipped = chunk[:, None] * limits[None, :]
    sizes = tf.clip_by_value(tf.gather(counts, example) - skipped, 0, limits[None, :])
    return sizes, tf.gather(starts, example) + skipped, example


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Items grouped by row (placement order kept within a row), and where each row's padding goes.

    The rows are written as one stream of R * length slots per key: each row's items, then one
    padding "item" filling the row. Slot order is row-major, so the stream reshapes to [R, length]
    with no scatter (TF's CPU scatter costs ~100 ns an index here; a gather of contiguous runs and
    `tf.ragged.range` cost a few).
    """

    group: tf.Tensor  # [N] grouped position -> placement index
    row: tf.Tensor  # [N] row of each grouped item
    segment: tf.Tensor  # [N] its segment id in the row (1-based)
    per_row: tf.Tensor  # [R] items in each row
    num_rows: tf.Tensor  # R
    item_slots: tf.Tensor  # [N] place of each grouped item among the N + R runs of the stream
    pad_slots: tf.Tensor  # [R] place of each row's padding run


def _layout(rows: tf.Tensor) -> _Layout:
    count = tf.shape(rows)[0]
    num_rows = tf.reduce_max(tf.concat([rows + 1, [0]], 0))
    wide = tf.cast(count, tf.int64)  # unique keys: no reliance on sort stability
    group = tf.argsort(tf.cast(rows, tf.int64) * wide + tf.range(wide))
    row = tf.gather(rows, group)
    per_row = tf.math.bincount(row, minlength=num_rows, maxlength=num_rows, dtype=tf.int32)
    segment = tf.range(count) - tf.gather(_exclusive_cumsum(per_row), row) + 1
    return _Layout(group, row, segment, per_row, num_rows,
                   item_slots=tf.range(count) + row, pad_slots=tf.cumsum(per_row) + tf.range(num_rows))


def _stride(limit: int) -> int:
    """The smallest power of two >= limit: a slot's segment and position share one integer,
    segment * stride + position, that shifts and masks take apart (cheaper than an integer division)."""
    return 1 << max(0, int(limit) - 1).bit_length()


def _rows_of_key(values: tf.Tensor, source: tf.Tensor, size: tf.Tensor, layout: _Layout, limit: int,
                 most_segments: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """One key's [R, limit] tokens, segment ids and positions, for grouped items of `size` tokens
    starting at `source` in `values`.

    Item runs read their tokens; padding runs read `limit` zeros appended to `values`. Segment and
    position come from one range per run: segment * stride + position for an item's tokens (stride:
    `_stride`, a power of two >= limit, so a shift and a mask take them apart, not a division and a
    remainder), negative (clamped to 0) for padding; in int64 when `most_segments`
    (a bound on a row's segments: the sum of all keys' lengths) times the stride would not fit int32.
    """
    padding = limit - tf.math.unsorted_segment_sum(size, layout.row, layout.num_rows)
    slots = [layout.item_slots, layout.pad_slots]
    run_size = tf.dynamic_stitch(slots, [size, padding])
    run_source = tf.dynamic_stitch(slots, [source, tf.fill([layout.num_rows], tf.size(values, tf.int32))])
    index = tf.ragged.range(run_source, run_source + run_size).flat_values
    tokens = tf.gather(tf.concat([values, tf.zeros([limit], values.dtype)], 0), index)
    stride = _stride(limit)
    wide = tf.int64 if (most_segments + 1) * stride >= 1 << 31 else tf.int32
    run_code = tf.dynamic_stitch(slots, [tf.cast(layout.segment, wide) * stride, -tf.cast(padding, wide)])
    code = tf.maximum(tf.ragged.range(run_code, run_code + tf.cast(run_size, wide)).flat_values, 0)
    segments = tf.bitwise.right_shift(code, tf.constant(stride.bit_length() - 1, wide))
    positions = tf.bitwise.bitwise_and(code, tf.constant(stride - 1, wide))
    out = (tokens, tf.cast(segments, tf.int32), tf.cast(positions, tf.int32))
    return tuple(tf.ensure_shape(tf.reshape(t, [-1, limit]), [None, limit]) for t in out)


def _as_ragged(key: str, tokens: Any) -> tf.RaggedTensor:
    """[W, None] tokens per example (a dense [W, n] tensor is W examples of n tokens)."""
    if not isinstance(tokens, tf.RaggedTensor):
        tokens = tf.RaggedTensor.from_tensor(tokens)
    if tokens.shape.rank != 2 or tokens.ragged_rank != 1:
        raise ValueError(f"pack_window: window[{key!r}] must be a [W, None] RaggedTensor, not {tokens.shape} "
                         f"with ragged_rank {tokens.ragged_rank}")
    return tokens


def pack_window(window: Mapping[str, tf.RaggedTensor], lengths: Mapping[str, int],
                algorithm: str = "first_fit_decreasing", overflow: str = "truncate",
                jit_compile: bool = True, counted: Optional[Mapping[str, int]] = None) -> dict[str, tf.Tensor]:
    """Packs one window of examples into rows; TF ops only, for a `dataset.map` or eager use.

    `window[k]`: a RaggedTensor [W, None] per key of `lengths` (the same W for all). An example fits
    a row only when every key fits its own length there; it gets the same segment id in every key.

    Algorithms (all deterministic):
    - `first_fit_decreasing`: items sorted by combined size, largest first (stable: ties keep window
      order), each into the lowest row where it fits. Combined size = sum over keys of
      tokens / length (the fraction of the row it fills; for one key, its length).
    - `best_fit_decreasing`: same order, into the fitting row whose combined room left after it is
      the least (ties to the lowest row).
    - `first_fit`: window order, lowest fitting row: keeps the order, packs less densely.
    Within a row, segments appear in the order the items were placed (decreasing size for the
    *_decreasing algorithms, window order for first_fit); rows are numbered in the order opened.

    Overflow of an example over a key's length: `truncate` keeps the head; `split` cuts every key
    into chunks of its length, chunk c of all keys forming one item (its own segment; positions
    restart at 0); `error` raises tf.errors.InvalidArgumentError naming the key, the length and the
    limit. Examples with no token in any key are dropped (no segment).

    Returns per key `k`, `k_segment_ids`, `k_positions` ([R, length]; `k` keeps its dtype, padded
    with 0), and per row the METADATA ints ([R]; keys start with "_"). `jit_compile`: run the
    sequential placement loop under XLA (same result; False for a TensorFlow build without XLA).
    A window's tokens are indexed in int32: under 2**31 tokens per key per window.

    `counted`: per-example integer features of the window ([W] each, e.g. a mixture's source) with the
    number of values each takes (name → n): each returned as `<name>_tokens` and `<name>_segments`,
    [R, n] int32: the tokens of the first key and the segments each value has in the row. A few
    numbers a row, where a value on every token would move a third more bytes through every stage.
    """
    check_packing(lengths, algorithm, overflow)
    ragged = {k: _as_ragged(k, window[k]) for k in lengths}
    placed = place_items(ragged, lengths, algorithm, overflow, jit_compile)
    values = {k: ragged[k].values for k in lengths}
    named = {name: tf.gather(window[name], placed[ITEM_EXAMPLE]) for name in (counted or {})}
    out = write_rows(values, placed, lengths, placed[ITEM_ROW], counted=counted, counted_values=named)
    num_rows = tf.shape(out[ROW_EXAMPLES])[0]
    out[ROW] = tf.range(num_rows)
    out[WINDOW_ROWS] = tf.fill([num_rows], num_rows)
    out[WINDOW_EXAMPLES] = tf.fill([num_rows], placed[ITEM_WINDOW])
    return out


# What `place_items` gives: each item of a window in placement order (one row each: the order the rows
# were filled in), with its row; `write_rows` writes the rows from them.
ITEM_SIZE = "_item_size"  # [N, K] int32: its tokens in each key
ITEM_SOURCE = "_item_source"  # [N, K] int32: where its tokens start in each key's values
ITEM_EXAMPLE = "_item_example"  # [N] int32: the window's example it comes from
ITEM_ROW = "_item_row"  # [N] int32: its row, rows numbered in the order they were opened
ITEM_WINDOW = "_item_window"  # scalar int32: the window's examples (W, empty ones included)


def place_items(window: Mapping[str, tf.RaggedTensor], lengths: Mapping[str, int], algorithm: str,
                overflow: str, jit_compile: bool = True) -> dict[str, tf.Tensor]:
    """`pack_window`'s first half: which row each item of the window goes to (`ITEM_*`), no token moved."""
    keys = list(lengths)
    counts = tf.stack([tf.cast(window[k].row_lengths(), tf.int32) for k in keys], axis=1)
    starts = tf.stack([tf.cast(window[k].row_starts(), tf.int32) for k in keys], axis=1)
    return place_spans(counts, starts, lengths, algorithm, overflow, jit_compile)


def place_spans(counts: tf.Tensor, starts: tf.Tensor, lengths: Mapping[str, int], algorithm: str, overflow: str,
                jit_compile: bool = True) -> dict[str, tf.Tensor]:
    """`place_items` for a window given as spans of its keys' values: example i's tokens of key k are
    [starts[i, k], starts[i, k] + counts[i, k]) (int32 [W, K], keys in the order of `lengths`), wherever
    they lie (the packer's windows point into the block they were parsed in)."""
    keys = list(lengths)
    limit_list = [lengths[k] for k in keys]
    weights = size_weights(limit_list)
    checks = [_check_lengths(k, counts[:, i], limit_list[i]) for i, k in enumerate(keys)] if overflow == "error" else []
    with tf.control_dependencies(checks):
        limits = tf.constant(limit_list, tf.int32)
        sizes, sources, example = _items(counts, starts, limits, overflow == "split")
    order = placement_order(sizes, weights, algorithm != "first_fit")
    rows = place(tf.gather(sizes, order), limits, tf.constant(weights, tf.int64), algorithm == "best_fit_decreasing",
                 jit_compile)
    return {ITEM_SIZE: tf.gather(sizes, order), ITEM_SOURCE: tf.gather(sources, order),
            ITEM_EXAMPLE: tf.cast(tf.gather(example, order), tf.int32), ITEM_ROW: rows,
            ITEM_WINDOW: tf.shape(counts)[0]}


def write_rows(values: Mapping[str, tf.Tensor], items: Mapping[str, tf.Tensor], lengths: Mapping[str, int],
               rows: tf.Tensor, counted: Optional[Mapping[str, int]] = None,
               counted_values: Optional[Mapping[str, tf.Tensor]] = None) -> dict[str, tf.Tensor]:
    """`pack_window`'s second half: the rows of placed items (`place_items`: sizes and sources, in
    placement order) with each item in row `rows[i]` (its own, or renumbered: the rows then leave in
    that order, written once; every row 0..R-1 must hold an item). Per key `k`, `k_segment_ids`,
    `k_positions` [R, length], ROW_EXAMPLES [R], and per `counted` name (`counted_values`: its value for
    each item) `<name>_tokens` and `<name>_segments` [R, n]."""
    keys = list(lengths)
    limit_list = [lengths[k] for k in keys]
    layout = _layout(rows)
    sizes, sources = (tf.gather(items[name], layout.group) for name in (ITEM_SIZE, ITEM_SOURCE))
    out: dict[str, tf.Tensor] = {}
    for i, key in enumerate(keys):
        out[key], out[f"{key}_segment_ids"], out[f"{key}_positions"] = _rows_of_key(
            values[key], sources[:, i], sizes[:, i], layout, limit_list[i], sum(limit_list))
    for name, count in (counted or {}).items():  # per row and value: one segment sum over the items
        value = tf.cast(tf.gather(counted_values[name], layout.group), tf.int32)
        cell = layout.row * count + value
        cells = layout.num_rows * count
        out[f"{name}_tokens"] = tf.reshape(tf.math.unsorted_segment_sum(sizes[:, 0], cell, cells), [-1, count])
        out[f"{name}_segments"] = tf.reshape(
            tf.math.unsorted_segment_sum(tf.ones_like(cell), cell, cells), [-1, count])
    out[ROW_EXAMPLES] = layout.per_row
    return out


def _rank(spec: Any) -> Optional[int]:
    """1: one example's tokens (a dense [n] tensor, or what unbatching a ragged batch gives);
    2: a ragged batch of examples [b, None] (what a batched parse with a RaggedFeature gives)."""
    if isinstance(spec, tf.TensorSpec) and spec.shape.rank == 1:
        return 1
    if isinstance(spec, tf.RaggedTensorSpec) and spec.shape.rank in (1, 2) and spec.ragged_rank == spec.shape.rank - 1:
        return spec.shape.rank
    return None


@dataclasses.dataclass(frozen=True)
class Packer(Stage):
    """Packs variable-length token features into rows of static `[length]`:
    ragged_batch(window) → map(pack_window) → unbatch (one row per element).

    Every feature of an element must be packed: a row has no place for a per-example feature (a
    label, an id); drop it before, or pack it.

    `window`: examples packed together. Larger packs denser (more rows to choose from); the cost
    per example falls up to ~1-2k (fixed per-window op costs) and rises past ~4k (each placement
    searches all of the window's rows). 1024 (benchmarks/bench_packing.py, lognormal lengths):
    99.5-99.7% of a row is tokens, against 98-99% at 256 and 93-97% at 64, at the least cost per
    example; a window holds ~2 MB of int32 tokens at a median of 300, and a resume replays at most
    one window. The last window of a finite dataset is partial. `window=None` takes elements that are
    already ragged batches of examples ([b, None] per feature, e.g. a batched `parse_example` with
    a RaggedFeature) and packs each as one window: no per-example element on the way, which costs
    more than the packing itself. `metadata` keeps pack_window's "_" keys.

    Rows leave through `unbatch` (`flat_map(from_tensor_slices)` measured the same; `rebatch` to
    the batch size saves the per-row element, for a stage that would pack and batch at once).
    """

    lengths: Mapping[str, int]
    window: Optional[int] = 1024
    algorithm: str = "first_fit_decreasing"
    overflow: str = "truncate"
    num_parallel_calls: Union[int, str] = "autotune"
    deterministic: Optional[bool] = None
    metadata: bool = False
    jit_compile: bool = True  # XLA for the placement loop; False: the executor's loops (placement_without_xla)
    counted: Optional[Mapping[str, int]] = None  # per-example int features counted per row (pack_window's)

    def __post_init__(self) -> None:
        check_packing(self.lengths, self.algorithm, self.overflow)
        if self.window is not None and (not isinstance(self.window, int) or isinstance(self.window, bool)
                                        or self.window < 1):
            raise ConfigError(f"sequence.window={self.window!r}: the packing window must be a positive integer")

    def check_spec(self, spec: Any) -> int:
        """The rank of the packed features (1: examples, 2: ragged batches), or a one-line ConfigError."""
        if not isinstance(spec, Mapping):
            raise ConfigError(f"packing needs dict elements of token features, but this dataset yields {spec}")
        for key in spec:
            if key not in self.lengths and key not in (self.counted or {}):
                raise ConfigError(f"feature '{key}' is not in sequence.keys: a packed row has no place for it; "
                                  "drop it with an op or add it to sequence.keys")
        ranks = set()
        for key in self.lengths:
            if key not in spec:
                raise ConfigError(f"sequence.keys names '{key}', but the elements have no such feature; "
                                  f"features here: {sorted(spec)}")
            rank = _rank(spec[key])
            if rank is None:
                raise ConfigError(f"feature '{key}' is {spec[key]}, not a 1-D sequence of tokens (or a ragged "
                                  "batch of them): only variable-length token features can be packed")
            ranks.add(rank)
        if len(ranks) > 1:
            raise ConfigError(f"sequence.keys mix single examples and ragged batches: {dict(spec)}")
        rank = ranks.pop()
        if (rank == 2) != (self.window is None):
            raise ConfigError(
                "sequence.window=None packs elements that are ragged batches of examples, but these are single "
                "examples; give a window" if rank == 1 else
                f"the elements are already ragged batches of examples: pack each as it comes with sequence.window=None "
                f"(not {self.window}), or unbatch them first")
        return rank

    def pack(self, window: Mapping[str, tf.RaggedTensor]) -> dict[str, tf.Tensor]:
        rows = pack_window(window, self.lengths, self.algorithm, self.overflow, self.jit_compile, self.counted)
        kept = {f"{name}_{what}" for name in (self.counted or {}) for what in ("tokens", "segments")}
        return rows if self.metadata else {k: v for k, v in rows.items() if not k.startswith("_") or k in kept}

    def apply(self, dataset: tf.data.Dataset, context: Optional[StageContext] = None) -> tf.data.Dataset:
        windows = dataset.ragged_batch(self.window) if self.check_spec(dataset.element_spec) == 1 else dataset
        calls = tune(self.num_parallel_calls)
        if calls == 1:
            packed = windows.map(self.pack, name="pack")
        else:
            packed = windows.map(self.pack, num_parallel_calls=calls, deterministic=self.deterministic, name="pack")
        return packed.unbatch()
