"""A mixture that ends before the run it feeds is over: found before the first step, in one line.

A mixture whose sources `drop` or `stop` delivers a fixed number of examples on each input pipeline
(`schedule.MixturePositions.length`, a closed form of the schedule). A `stop` source too small for its
share ends the whole mixture early: training would run out of data part way (Keras only warns, and
stops the epoch) and a batch-dropping pipeline could deliver nothing at all, output that looks complete
and isn't. `check_mixture_length` compares that length with what the run needs and names the source at
fault, its records there, its weight and the fix.

What a run needs, in examples of one input pipeline (`needed_examples`):

- examples are rows (no data.sequence, or pad mode): a step takes `Pipeline.examples_per_step(context)`
  examples from each input pipeline, so training needs `steps_per_epoch × epochs` of them;
- pack mode with overflow truncate or error: each example fills at most one row, so a row needs at least
  one example: as many examples as rows is a lower bound (it says "at least");
- pack mode with overflow split, and bucket mode: a row is not an example (one long document may fill
  many rows; a bucket's batch has its own size), so the only bound stated is one example.

Without a stated need (`None`), the check asks for one step's worth (one global batch, the share of
this input pipeline) when the batch drops a short remainder, else one example.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.mixtures.mixture_source import MixtureSource

FIX = "lower its weight, give it more records, or set its exhausted: drop (it leaves) or repeat"


def _mixture_of(pipeline_or_source: Any) -> Optional[MixtureSource]:
    source = getattr(pipeline_or_source, "source", pipeline_or_source)
    return source if isinstance(source, MixtureSource) else None


def _reading_context(pipeline_or_source: Any, context: tf.distribute.InputContext) -> tf.distribute.InputContext:
    """The context the mixture is read with: bucket mode on several input pipelines reads the whole stream."""
    mode = getattr(pipeline_or_source, "sequence_mode", None)
    if mode is not None and mode.shares_stream(context):
        return tf.distribute.InputContext(1, 0, context.num_replicas_in_sync)
    return context


def rows_are_bounded(pipeline: Any) -> bool:
    """Whether every example fills at most one batch row (so a row needs at least one example):
    no data.sequence, pad mode, or pack mode that never splits an example."""
    windowed = getattr(pipeline, "windowed", None)
    if windowed is None:
        return True
    return pipeline.sequence_mode.example_in_one_row(getattr(windowed, "overflow", ""))


def rows_are_examples(pipeline: Any) -> bool:
    """Whether a batch row is exactly one example (no data.sequence, or pad mode)."""
    return getattr(pipeline, "windowed", None) is None


def one_step_need(pipeline: Any, context: tf.distribute.InputContext) -> tuple[int, str]:
    """(examples, why) the stream must hold to make its first step (None given as the need)."""
    batch = getattr(getattr(pipeline, "parts", None), "batch", None)
    if batch is None or not getattr(batch, "drop_remainder", False) or not rows_are_bounded(pipeline):
        return 1, "one example to make any batch"
    per_step = pipeline.examples_per_step(context)
    unit = "examples" if rows_are_examples(pipeline) else "packed rows, each holding at least one example,"
    return per_step, f"one global batch of {pipeline.global_batch_size():,}: {per_step:,} {unit} on this input pipeline"


def training_need(pipeline: Any, context: tf.distribute.InputContext, steps_per_epoch: int,
                  epochs: int) -> tuple[int, str]:
    """(examples, why) input pipeline `context` must deliver for `steps_per_epoch × epochs` training steps:
    exact where rows are examples, a lower bound where each example fills at most one row, else one example."""
    if not rows_are_bounded(pipeline):
        return 1, ("one example (a packed row with overflow split, or a bucket's batch, holds no fixed number "
                   "of examples, so no more is stated)")
    per_step = pipeline.examples_per_step(context)
    steps = int(steps_per_epoch) * int(epochs)
    if rows_are_examples(pipeline):
        return steps * per_step, (f"train.steps_per_epoch={steps_per_epoch} x train.epochs={epochs} steps of "
                                  f"{per_step:,} examples on this input pipeline")
    return steps * per_step, (f"train.steps_per_epoch={steps_per_epoch} x train.epochs={epochs} steps of {per_step:,} "
                              "packed rows on this input pipeline, and a row holds at least one example")


def _where(context: tf.distribute.InputContext) -> str:
    if context.num_input_pipelines <= 1:
        return "on its one input pipeline"
    return f"on input pipeline {context.input_pipeline_id} of {context.num_input_pipelines}"


def check_mixture_length(pipeline_or_source: Any, needed_examples: Optional[int] = None,
                         context: Optional[tf.distribute.InputContext] = None, *, needed_for: str = "",
                         prefix: str = "data") -> None:
    """Raises ConfigError (one line) if the mixture of `pipeline_or_source` ends before it delivers
    `needed_examples` examples on input pipeline `context` (None: what one step needs, `one_step_need`).

    Nothing to check for a source that is no mixture, or a mixture that never ends (a `repeat` source
    and no `stop` one). The line names the `stop` source that ends it (the one whose first choice past
    its end comes first in the schedule), its records on this input pipeline, its weight, the examples
    delivered before the end and the examples needed (`needed_for` says why), and the fix. The weights
    are those in force from the start of the stream (a pipeline as `from_config` makes it)."""
    mixture = _mixture_of(pipeline_or_source)
    if mixture is None:
        return
    context = context or tf.distribute.InputContext()
    if needed_examples is None:
        needed_examples, needed_for = (one_step_need(pipeline_or_source, context) if pipeline_or_source is not mixture
                                       else (1, "one example"))
    positions = mixture.positions(_reading_context(pipeline_or_source, context))
    length = positions.length
    if length is None or length >= needed_examples:
        return
    why = f" ({needed_for})" if needed_for else ""
    need = f"needs {needed_examples:,}{why}"
    where = _where(context)
    quotas = positions.schedule.quotas
    if positions.end is not None:
        index = _stopping_source(positions)
        part = mixture.parts[index]
        share = quotas[index] / quotas.sum()
        rate = f"weight {part.weight:g}"
        if not np.isclose(share, part.weight / sum(p.weight for p in mixture.parts), atol=1 / quotas.sum()):
            rate += f" by tokens, {share:.1%} of the examples"  # weight_by: tokens: the example rate differs
        else:
            rate += f", {share:.1%} of the examples"
        raise ConfigError(
            f"{prefix}.mixture.sources[{index}] ({part.name}): its {positions.totals[index]:,} records {where} "
            f"({rate}) run out first, and with exhausted: stop that ends the mixture after {length:,} examples, "
            f"but the run {need}; {FIX}")
    records = ", ".join(f"{part.name} {total:,}" for part, total, quota in zip(mixture.parts, positions.totals, quotas)
                        if quota > 0)
    raise ConfigError(
        f"{prefix}.mixture: every source ends (exhausted: drop or stop), after {length:,} examples in all {where} "
        f"(records there: {records}), but the run {need}; give the sources more records, lower what the run "
        f"takes, or set a source's exhausted: repeat")


def _stopping_source(positions: Any) -> int:
    """The `stop` source whose first choice past its end comes first (it ends the mixture)."""
    ends = {index: positions.schedule.position_of(index, total + 1)
            for index, (total, stop) in enumerate(zip(positions.totals, positions.stops))
            if stop and total is not None and positions.schedule.quotas[index] > 0}
    return min(ends, key=ends.get)


def check_training_mixture(pipeline: Any, steps_per_epoch: int, epochs: int, num_input_pipelines: int,
                           num_replicas: int) -> None:
    """`check_mixture_length` on every input pipeline of a training run of `steps_per_epoch × epochs` steps
    (one host is one input pipeline under `distribute_datasets_from_function`)."""
    mixture = _mixture_of(pipeline)
    if mixture is None:
        return
    for index in range(max(1, int(num_input_pipelines))):
        context = tf.distribute.InputContext(max(1, int(num_input_pipelines)), index, int(num_replicas))
        if mixture.positions(_reading_context(pipeline, context)).length is None:
            return  # it never ends (the same on every input pipeline: the policies are)
        needed, why = training_need(pipeline, context, steps_per_epoch, epochs)
        check_mixture_length(pipeline, needed, context, needed_for=why, prefix=getattr(pipeline, "prefix", "data"))
