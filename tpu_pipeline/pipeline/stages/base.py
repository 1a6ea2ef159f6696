"""The one stage interface: `stage.apply(dataset, context) -> dataset`, then `stage.after(context)`,
the context the next stage sees.

Why one: the pipeline's engine (`builder.apply_stages`) applies every stage the same way and never
asks what a stage is. What a stage may need besides its dataset travels in one small frozen
`StageContext`: the input pipeline (`tf.distribute.InputContext`), the epoch (stages before the
repeat), and where a resumed stream starts. A stage reads what it needs and ignores the rest; a stage
that changes what one element is (a `Batch`) says so in `after`. grain's `IterDataset` (one contract
for every transformation) is the model.

Used alone, a stage takes `StageContext()` (one input pipeline, epoch and position 0) or
`StageContext(tf.distribute.InputContext(...))`.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Optional

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class StageContext:
    """What a stage may read: the input pipeline, the epoch, and a resumed stream's start."""

    input: tf.distribute.InputContext = dataclasses.field(default_factory=tf.distribute.InputContext)
    epoch: Optional[tf.Tensor] = None  # a scalar int64 tensor before the repeat; None after it
    examples: int = 0  # examples the stream delivered before (a resume)
    unit: int = 1  # examples per element where the stage runs (a Batch before it sets this)
    chunk: int = 0  # pack mode: chunks of example `examples` delivered before
    skip: int = 0  # outputs of a windowed stage's first window delivered before
    first_epoch: int = 0  # through tf.data service: the epoch a (restarted) job begins with

    @property
    def position(self) -> int:
        """Elements that entered this stage before: examples, or batches after a Batch."""
        return self.examples // self.unit

    # The input context's fields, read as a stage reads an InputContext.
    @property
    def input_pipeline_id(self) -> int:
        return self.input.input_pipeline_id

    @property
    def num_input_pipelines(self) -> int:
        return self.input.num_input_pipelines

    @property
    def num_replicas_in_sync(self) -> int:
        return self.input.num_replicas_in_sync


class Stage:
    """Base of every stage: `apply` the dataset in `context`; `after` gives the next stage's context."""

    uses_epoch = False  # True: its randomness changes per epoch (the engine then builds epochs one by one)
    # The parts of a pipeline this stage plays (`roles.ROLES`: cache, repeat, windowed, batch, outputs,
    # service, prefetch, options, steps), read once by `roles.split_by_roles`; none: a map stage.
    roles: ClassVar[tuple[str, ...]] = ()

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        raise NotImplementedError

    def after(self, context: StageContext) -> StageContext:
        return context
