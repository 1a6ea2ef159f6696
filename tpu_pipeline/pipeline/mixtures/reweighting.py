"""A mixture resumed with other weights: the rows in flight keep the old ones, the new ones start right after.

A windowed pipeline (data.sequence pack or bucket) resumes at the window (pack: the pool of
`row_shuffle` windows) of its last delivered output, which it rebuilds and skips into. That window
must come out again exactly as it was, so every example it holds a piece of must come from the old
weights: the new ones may only choose from the first example after it. How many examples a window
holds pieces of is a fact of the data, not of the configuration: a pack window is `window` chunks,
and a document with no token (a one-token document after `lm_shift`) makes no chunk, so a window may
cover any number of examples. `window_in_flight` therefore replays that one window with the saved
weights (the stream up to the windowed stage, nothing after it) and reads where the next window
starts. Without a window (pad, no data.sequence) nothing is in flight: the new weights choose the
very next example.

    pipeline, message = resumed(pipeline, saved_state, context, start, chunk, skip, per_step=8)

What a resume costs for it: one window more to pack, once, and only when the weights changed.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from tpu_pipeline.pipeline.core.resume_position import POSITION_KEYS


@dataclasses.dataclass(frozen=True)
class InFlight:
    """The window of a resume point: `end`, the first example of the stream none of whose pieces it holds
    (None: the stream ends within it); `outputs`, its outputs (pack: rows) after the ones delivered."""

    end: Optional[int]
    outputs: int


def window_in_flight(pipeline: Any, context: tf.distribute.InputContext, start: int, chunk: int = 0,
                     skip: int = 0) -> InFlight:
    """Where the window that starts at (`start`, `chunk`) ends, read from the windowed stage's own outputs
    (their positions: every output of a window carries the window's first (example, chunk)). The next
    window starts at (e, c): with c > 0 example e is cut between the two, so its first pieces are in
    flight too."""
    if pipeline.windowed is None:
        return InFlight(start, 0)
    upto = pipeline.with_parts(pipeline.parts.until("windowed", inclusive=True))
    upto = dataclasses.replace(upto, check_tpu=False) if dataclasses.is_dataclass(upto) else upto
    stream = upto.build(context, start=start, chunk=chunk, with_position=True)
    numbers = stream.map(lambda features, position: _window_starts(position)).unbatch().batch(1024)
    outputs = 0
    for block in numbers.as_numpy_iterator():
        moved = np.flatnonzero((block[:, 0] != start) | (block[:, 1] != chunk))
        if moved.size:
            example, piece = (int(value) for value in block[moved[0]])
            return InFlight(example + (1 if piece else 0), outputs + int(moved[0]) - skip)
        outputs += len(block)
    return InFlight(None, outputs - skip)


def _window_starts(position: dict) -> tf.Tensor:
    """int64 [n, 2]: the (example, chunk) where the window of each output of an element starts (an element
    may carry one output's position or a block of them: `resume_position.position_fields`)."""
    hi, lo, chunk = (tf.cast(tf.reshape(position[key], [-1]), tf.int64) for key in POSITION_KEYS[:3])
    return tf.stack([hi * (1 << 31) + lo, chunk], axis=1)


def outputs_per_step(pipeline: Any, context: tf.distribute.InputContext, distributed: bool = True) -> int:
    """The windowed stage's outputs one step (`distributed`: of a strategy; else one batch of this input
    pipeline) takes: pack's rows are batched after it; bucket's outputs are batches already."""
    mode = pipeline.sequence_mode if pipeline.windowed is not None else None
    if mode is not None and mode.windowed_outputs_are_batches:
        return max(1, context.num_replicas_in_sync // max(1, context.num_input_pipelines)) if distributed else 1
    return pipeline.examples_per_step(context) if distributed else pipeline.examples_per_batch(context)


def resumed(pipeline: Any, state: Optional[str], context: tf.distribute.InputContext, start: int, chunk: int = 0,
            skip: int = 0, per_step: int = 1, step_name: str = "step") -> tuple[Any, Optional[str]]:
    """`pipeline` continuing the saved source `state` (`Source.resume_state()` at the save) from example
    `start` of this input pipeline's stream (a windowed one: the window at (`start`, `chunk`), `skip` of its
    outputs delivered); and the line to show when the weights changed (None: nothing did). `per_step`:
    outputs of the windowed stage per `step_name` (the line counts in them)."""
    source = pipeline.source
    if state is None or source.resume_state() is None:
        return pipeline, None
    same, message = source.with_resume_state(state, start, 0)
    if message is None:
        return pipeline.with_source(same), None
    saved = source.as_saved(state)
    flight = window_in_flight(pipeline.with_source(saved), context, start, chunk, skip)
    end = flight.end
    if end is None:  # the stream ends within the window in flight: the new weights start at its end
        length = saved.stream_length(context) if hasattr(saved, "stream_length") else None
        end = start if length is None else max(start, length)
    steps = -(-max(0, flight.outputs) // max(1, per_step))
    what = pipeline.sequence_mode.windowed_output if pipeline.windowed is not None else "output"
    what += "" if flight.outputs == 1 else "s"
    steps_of = f"{steps} {step_name}(s)" if step_name == "step" else f"{steps} {step_name}(es)"

    def when(switch: int) -> str:
        if pipeline.windowed is None:
            return (f"at once, from the next {step_name} (example {switch:,} of this input pipeline's stream): "
                    "nothing is in flight without data.sequence pack or bucket")
        if switch > end:  # an earlier change had not taken effect yet: this one takes its place
            return (f"from example {switch:,} of this input pipeline's stream, where the previous change was to take "
                    "effect (the stream has not reached it yet)")
        if flight.end is None:
            return (f"never: this input pipeline's stream ends with the {flight.outputs} {what} still in flight, "
                    "which the old ones made")
        return (f"after {steps_of} of this input pipeline: the {flight.outputs} {what} still in flight "
                f"(the window at example {start:,}, made before the change) keep the old ones, and the new ones "
                f"choose from example {switch:,} of its stream on")

    changed, message = source.with_resume_state(state, start, end - start, when)
    return pipeline.with_source(changed), message
