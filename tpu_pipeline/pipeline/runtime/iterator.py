"""Iterators that `tf.train.Checkpoint` saves by position: a few integers, never buffered elements.

    it = pipeline.iterator(input_context)               # one input pipeline's batches
    dist_it = pipeline.distributed_iterator(strategy)   # global steps of a strategy
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt, data=dist_it)

What is saved: `position` (batches or global steps delivered by `next`) and `examples_per_batch`
(the per-replica or global batch: a check that it did not change): two int64 scalars, 16 bytes (a
bucket or pack pipeline adds three: where its window starts and its outputs delivered), whatever the shuffle
buffer, record cache or record size. A pipeline's epochs are pure functions of (data.seed, epoch,
input pipeline) (tpu_pipeline.pipeline.core.seeds), so after a restore the next `next` rebuilds the
dataset at that position (`Pipeline.build(start=...)`): it rebuilds the current epoch and skips the
records already delivered, unparsed. tf.data's own iterator checkpoint saves whole shuffle buffers
instead, and under a strategy was long not checkpointable at all.

Count on `next` being called eagerly (outside `tf.function`): the position counts Python calls.

A damaged record fails inside TF with no file named (`jpeg::Uncompress failed`, `corrupted record
at N`, a feature `required but could not be found`). `next` turns those errors (`DATA_ERRORS` of
`tpu_pipeline.pipeline.data_errors`) into one `DataError` line naming the file, the record and the
fix, found by a scan of the pipeline's files that stops at the first fault (`Pipeline.naming_data_errors`,
the same context manager a user's own loop or `model.fit` can use); the end of the data
(`StopIteration`) and every other exception pass unchanged, and so does a data error of a pipeline
built without a config (nothing to scan).
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Optional, Protocol

import tensorflow as tf
from absl import logging

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.core.resume_position import last_position
from tpu_pipeline.pipeline.mixtures.reweighting import outputs_per_step, resumed
from tpu_pipeline.pipeline.sequences.sequence_stages import Windowed


class ResumablePipeline(Protocol):
    """What an iterator calls of a `builder.Pipeline` (which makes these iterators, so is not imported here)."""

    @property
    def windowed(self) -> Optional[Windowed]: ...

    def build(self, input_context: Optional[tf.distribute.InputContext] = None, start: int = 0, skip: int = 0,
              with_position: bool = False, chunk: int = 0) -> tf.data.Dataset: ...

    def global_batch_size(self) -> int: ...

    def examples_per_batch(self, context: tf.distribute.InputContext) -> int: ...

    def examples_per_step(self, context: tf.distribute.InputContext) -> int: ...

    def naming_data_errors(self) -> AbstractContextManager[Any]: ...

    @property
    def source(self) -> Any: ...

    def with_parts(self, parts: Any) -> "ResumablePipeline": ...

    @property
    def parts(self) -> Any: ...

    def with_source(self, source: Any) -> "ResumablePipeline": ...


class _Box:
    """Holds the live tf.data iterator out of the checkpoint's sight (it is not a Trackable attribute)."""

    def __init__(self) -> None:
        self.iterator: Any = None
        self.built_at = -1  # the position the live iterator started from
        self.delivered = 0  # batches it has delivered since


class _PositionIterator(tf.Module):
    """Base: a `position` variable, and a live iterator rebuilt whenever the position moves under it.

    A windowed pipeline (data.sequence bucket or pack) cannot compute where step k leaves off from
    k: how many examples a batch holds depends on the data. It saves the place itself, read from
    the elements as they pass: where the window of the last delivered output starts (`example`,
    `chunk`) and `in_window` (outputs of that window delivered), and rebuilds there
    (`Pipeline.build(start=, chunk=, skip=)`).
    """

    def __init__(self, pipeline: ResumablePipeline, examples_per_batch: int, name: str) -> None:
        super().__init__(name=name)
        self._pipeline = pipeline
        self._windowed = pipeline.windowed
        with tf.init_scope():
            self.position = tf.Variable(0, dtype=tf.int64, trainable=False, name="position",
                                        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
            self.examples_per_batch = tf.Variable(examples_per_batch, dtype=tf.int64, trainable=False,
                                                  name="examples_per_batch",
                                                  aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
            if self._windowed is not None:
                self.example = tf.Variable(0, dtype=tf.int64, trainable=False, name="example",
                                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
                self.chunk = tf.Variable(0, dtype=tf.int64, trainable=False, name="chunk",
                                         aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
                self.in_window = tf.Variable(0, dtype=tf.int64, trainable=False, name="in_window",
                                             aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
            # A mixture's weights and since when (the position alone cannot say which weights made it).
            state = pipeline.source.resume_state()
            self.source_state = None if state is None else tf.Variable(
                state, dtype=tf.string, trainable=False, name="source_state",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self._examples_per_batch = examples_per_batch
        self._box = _Box()
        self._applied = state  # the source state the pipeline holds now

    def _with_saved_source(self, example: int, context: tf.distribute.InputContext, chunk: int = 0,
                           skip: int = 0) -> ResumablePipeline:
        """The pipeline whose source continues the saved state (a restored checkpoint's), logged where it
        changed (a mixture's weights: the rows in flight keep the old ones, `reweighting`); `example`,
        `chunk`, `skip`: where this input pipeline's stream resumes."""
        if self.source_state is None:
            return self._pipeline
        saved = self.source_state.numpy().decode()
        if saved != self._applied:
            distributed = isinstance(self, DistributedPipelineIterator)
            pipeline, message = resumed(self._pipeline, saved, context, example, chunk, skip,
                                        per_step=outputs_per_step(self._pipeline, context, distributed),
                                        step_name="step" if distributed else "batch")
            if message:
                logging.warning("%s", message)
            self._pipeline = pipeline
            self._applied = pipeline.source.resume_state()
            self.source_state.assign(self._applied)
        return self._pipeline

    def _make(self, position: int) -> Any:
        raise NotImplementedError

    def _resume_point(self) -> tuple[int, int, int]:
        """(example and chunk where the window to rebuild starts, outputs of it to skip) of a windowed pipeline."""
        return int(self.example.numpy()), int(self.chunk.numpy()), int(self.in_window.numpy())

    def _last_position(self, position: Any) -> tuple[int, int, int]:
        """(example, chunk, index) of the last output of an element's position tensors."""
        example, chunk, index = last_position(position).numpy().tolist()
        return int(example), int(chunk), int(index)

    def _live(self) -> Any:
        position = int(self.position.numpy())
        box = self._box
        if box.iterator is None or box.built_at + box.delivered != position:
            saved = int(self.examples_per_batch.numpy())
            if saved != self._examples_per_batch:
                raise ConfigError(
                    f"the checkpointed input position counts batches of {saved} examples per input pipeline, but this "
                    f"pipeline's are {self._examples_per_batch}: restore with the batch size and number of replicas "
                    "it was saved with"
                )
            box.iterator, box.built_at, box.delivered = self._make(position), position, 0
        return box.iterator

    def __iter__(self) -> "_PositionIterator":
        return self

    def __next__(self) -> Any:
        with self._pipeline.naming_data_errors():
            element = next(self._live())
        if self._windowed is not None:
            element, position = element
            example, chunk, index = self._last_position(position)
            self.example.assign(example)
            self.chunk.assign(chunk)
            self.in_window.assign(index + 1)
        self._box.delivered += 1
        self.position.assign_add(1)
        return element

    def get_next(self) -> Any:
        return self.__next__()

    @property
    def element_spec(self) -> Any:
        spec = self._live().element_spec
        return spec[0] if self._windowed is not None else spec


class PipelineIterator(_PositionIterator):
    """One input pipeline's batches (`Pipeline.iterator`); position = batches delivered."""

    def __init__(self, pipeline: ResumablePipeline, input_context: Optional[tf.distribute.InputContext] = None) -> None:
        self._context = input_context or tf.distribute.InputContext()
        super().__init__(pipeline, pipeline.examples_per_batch(self._context), "pipeline_iterator")

    def _make(self, position: int) -> Any:
        if self._windowed is not None:
            start, chunk, skip = self._resume_point()
            pipeline = self._with_saved_source(start, self._context, chunk, skip)
            return iter(pipeline.build(self._context, start=start, chunk=chunk, skip=skip, with_position=True))
        pipeline = self._with_saved_source(position * self._examples_per_batch, self._context)
        return iter(pipeline.build(self._context, start=position * self._examples_per_batch))


class DistributedPipelineIterator(_PositionIterator):
    """Global steps of `strategy.distribute_datasets_from_function`; position = steps delivered."""

    def __init__(self, pipeline: ResumablePipeline, strategy: tf.distribute.Strategy) -> None:
        self._strategy = strategy
        super().__init__(pipeline, pipeline.global_batch_size(), "distributed_pipeline_iterator")

    def _make(self, position: int) -> Any:
        if self._windowed is not None:
            start, chunk, skip = self._resume_point()
            return iter(self._strategy.distribute_datasets_from_function(
                lambda context: self._with_saved_source(start, context, chunk, skip).build(
                    context, start=start, chunk=chunk, skip=skip, with_position=True)))

        def build(context: tf.distribute.InputContext) -> tf.data.Dataset:
            start = position * self._pipeline.examples_per_step(context)  # the same on every input pipeline
            return self._with_saved_source(start, context).build(context, start=start)

        return iter(self._strategy.distribute_datasets_from_function(build))

    def _last_position(self, position: Any) -> tuple[int, int, int]:
        """The last replica's: a pipeline's consecutive outputs go to its replicas in turn."""
        last = {key: self._strategy.experimental_local_results(value)[-1] for key, value in position.items()}
        return super()._last_position(last)
