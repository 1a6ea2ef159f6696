"""The resume position: how a pipeline's place in its stream is encoded, carried and restored.

The whole story on one page (docs/resume.md tells it with the checkpoint around it). A pipeline's
epochs are pure functions of (data.seed, epoch, input pipeline) (`seeds`), so its place is a few
integers, never a buffer: grain's `get_state`/`set_state`, in tf.data.

Encoded. Without a window (no data.sequence, or pad mode) the place is computed, not carried: the
iterator's `position` (batches or global steps delivered) times the examples in one. A windowed
pipeline (bucket, pack) cannot compute it, since how many examples a batch holds depends on the
data, so every output carries its place beside its features, under `POSITION_KEYS`: the stream
position (example, chunk) where its window (pack: its pool of `row_shuffle` windows) starts, and its
index among that window's outputs. int32 fields, as a TPU takes them with the batch; the example
number in two halves (`_example_hi`, `_example`), since a long run of short examples passes 2**31.

Carried. The windowed stage writes the fields (`sequence_stages.Windowed`, with `position_fields`);
the stages after it carry them like any feature (a `Batch` of rows carries one per row); the outputs
stage takes them off (`stages.outputs.ToOutputs`, or `SplitPosition` where a pipeline has no outputs), and
`Pipeline.build(with_position=True)` returns them beside each element: (element, position).

Read. The package's iterators (`runtime.iterator`) read the last output's place from each element
they hand out (`last_position`) into three int64 variables a `tf.train.Checkpoint` saves: `example`,
`chunk`, `in_window` (index + 1). `model.fit` takes a dataset, not an iterator: `runtime.position_log`
logs each element's place as it is taken, and `train.windowed_position` saves the one of the last
finished step. A mixture adds its weights (`source_state`), which the position alone cannot tell.

Restored. `Pipeline.build(start=example, chunk=chunk, skip=in_window)`: the epoch of `example` is
rebuilt and the records before it skipped unparsed (`builder.skip_examples`); the chunk stream
resumes at (example, chunk) (`chunking`); the windowed stage numbers its windows from there and skips
the `in_window` outputs of the first one already delivered. At most one window is placed again.
Without a window, `Pipeline.build(start=examples)` alone: epoch `examples // L`, offset `examples % L`.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

Features = dict[str, Any]

POSITION_KEYS = ("_example_hi", "_example", "_chunk", "_index")
INDEX_KEY = "_index"  # an output's place among its window's outputs
_HALF = 1 << 31


def position_fields(example: tf.Tensor, chunk: tf.Tensor, index: tf.Tensor) -> Features:
    """The position keys of outputs numbered `index` (a vector) of the window starting at (example, chunk)."""
    example = tf.cast(example, tf.int64)
    ones = tf.ones_like(index, tf.int32)
    return {"_example_hi": tf.cast(example // _HALF, tf.int32) * ones, "_example": tf.cast(example % _HALF, tf.int32) * ones,
            "_chunk": tf.cast(chunk, tf.int32) * ones, INDEX_KEY: tf.cast(index, tf.int32)}


def last_position(position: Features) -> tf.Tensor:
    """int64 [example, chunk, index] of the last output in an element's position (a batch of rows carries one per row)."""
    hi, lo, chunk, index = (tf.cast(tf.reshape(position[key], [-1])[-1], tf.int64) for key in POSITION_KEYS)
    return tf.stack([hi * _HALF + lo, chunk, index])


def split_position(features: Features) -> tuple[Features, Features]:
    """(the features without the resume position, the position: {} where there is none)."""
    return ({k: v for k, v in features.items() if k not in POSITION_KEYS},
            {k: features[k] for k in POSITION_KEYS if k in features})
