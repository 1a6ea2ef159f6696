"""A resume with another global batch (data.batch_size, accepted by train.allow_changes) goes on by examples.

A run moved to a smaller slice often halves its global batch to keep each chip's. Its step counted batches of
the old size, and the step is what places the input (a stream of examples, or a mixture of them: step x the
global batch), lays out train.steps_per_epoch and the learning-rate schedule. Kept as it was, the new run
would read the interrupted epoch from another example and put the schedule at another point of its epochs.
So the step is rebased: examples trained so far / the new batch. The input goes on at the same example, the
schedule (laid out in epochs of the new batch's steps) at the same point, and the epoch count with it.

Where that is not a whole number of new batches, the resume is refused in one line: a step's worth of the
input could not be placed exactly. A packed stream counts its rows, with the same rule; a bucketed one counts its
batches' slots (filler examples too), and its window goes on past the examples the old batch's groups held
(`WindowedPosition.rebase`).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from tpu_pipeline.config import Config
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.sequences.modes.registry import sequence_mode
from tpu_pipeline.train.started_with import saved_record

BATCH_KEY = "data.batch_size"


def rebased_step(step: int, was: int, now: int, run_dir: str, latest: str, unit: str = "examples") -> int:
    """The step of this run's batch (`now`) that has trained the examples (`unit`: or packed rows) of `step`
    batches of `was`."""
    examples = step * was
    if examples % now:
        fits = sorted(size for size in range(8, 4 * max(was, now) + 1, 8) if examples % size == 0)
        near = sorted(sorted(fits, key=lambda size: abs(size - now))[:3]) or [was]
        raise ConfigError(
            f"train.run_dir={run_dir}: {latest} trained {examples:,} {unit} ({step} steps of {was}), which is not a "
            f"whole number of batches of data.batch_size={now}; resume with a batch that divides it (the nearest: "
            f"{', '.join(map(str, near))}), or train on with data.batch_size={was} to a step where {now} does")
    return examples // now


def go_on_by_examples(latest: str, config: Config, model: Any, steps_per_epoch: int, layout: Optional[Any],
                      was_steps_per_epoch: Callable[[int], Optional[int]], printer: Callable[[str], None]) -> int:
    """After the restore of `latest`: the step this run goes on from. With the checkpoint's global batch, the
    optimizer's; with another, rebased to this run's batch (the optimizer's step, and an example stream's saved
    layout or a windowed stream's position with it: `layout`), and a line that says so."""
    step = int(model.optimizer.iterations.numpy())
    saved = saved_record(latest)
    was = (saved or {}).get("identity", {}).get(BATCH_KEY)
    now = config.data.batch_size
    if was is None or was == now or step == 0:
        return step
    sequence = config.data.sequence
    unit = (sequence_mode(sequence.mode).row_name if sequence is not None else "") or "examples"
    rebased = rebased_step(step, was, now, config.train.run_dir, latest, unit)
    model.optimizer.iterations.assign(rebased)
    if layout is not None:
        layout.rebase(step, rebased, was)
    before = was_steps_per_epoch(was)
    per_epoch = f"; steps per epoch {before} -> {steps_per_epoch}" if before and before != steps_per_epoch else ""
    printer(f"{BATCH_KEY} {was} -> {now}: the run goes on by {unit} trained, {step * was:,}: step {step} -> "
            f"{rebased}{per_epoch}; the input and the learning-rate schedule go on from where they stood")
    return rebased
