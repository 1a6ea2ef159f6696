"""A mixture's weights in `train`'s checkpoints: which weights made the stream so far, and since when.

The input position alone (a step, or a window's (example, chunk)) does not say which weights chose the
examples before it, so the checkpoint keeps, for each input pipeline (one per host), the mixture's
segments of weights (`MixtureSource.resume_state()`: a few numbers as text). A run resumed with other
weights goes on from them (`reweighting.resumed`): the rows in flight keep the old weights, the new
ones choose from the first example after them, every source continues where it stopped, and `train`
prints after how many steps the new weights take effect. Each input pipeline's segments are computed
on every host from the positions in the checkpoint (which hold every host's), so the chief's save holds
every pipeline's.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Callable, Optional

import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.pipeline.core.row_remainder import IN_REST
from tpu_pipeline.pipeline.mixtures.reweighting import outputs_per_step, resumed
from tpu_pipeline.train.mixed_slice import weights_line

MIXTURE_KEY = "mixture"  # the mixture's weights in the checkpoint (MixtureState)


class MixtureState(tf.Module):
    """Each input pipeline's mixture state (a JSON list, one entry a pipeline), and the pipeline that
    continues it."""

    def __init__(self, pipeline: Pipeline, num_pipelines: int) -> None:
        super().__init__(name="mixture_state")
        self._pipeline = pipeline
        self._count = int(num_pipelines)
        self._pipelines: dict[int, Pipeline] = {}
        self._dealt: Optional[list[str]] = None  # after `start_own`: the lines `resume` says
        with tf.init_scope():
            self.segments = tf.Variable(json.dumps([pipeline.source.resume_state()] * self._count), dtype=tf.string,
                                        trainable=False, name="segments")

    @staticmethod
    def of(pipeline: Pipeline, num_pipelines: int) -> Optional["MixtureState"]:
        """The state of a mixture's pipeline; None for a single source (its position says everything)."""
        return MixtureState(pipeline, num_pipelines) if pipeline.source.resume_state() is not None else None

    def saved_states(self) -> list[str]:
        """The restored states as saved: one per input pipeline of the checkpoint's hosts (`mixed_slice.deal`)."""
        return json.loads(self.segments.numpy().decode())

    def start_own(self, first_epochs: tuple[int, ...], old_states: tuple[str, ...]) -> None:
        """A resume on another number of hosts (`mixed_slice`): every input pipeline of this run mixes its own shards
        with this config's weights, each source from its epoch `first_epochs[i]` (the rest before, made by
        `old_states`, was dealt); `resume` then says whether the weights changed."""
        source = dataclasses.replace(self._pipeline.source, first_epochs=tuple(first_epochs), earlier=(), since=0)
        own = self._pipeline.with_source(source)
        self._pipelines = {index: own for index in range(self._count)}
        self._dealt = [line for line in [weights_line(old_states, source)] if line]
        self.segments.assign(json.dumps([source.resume_state()] * self._count))

    def _saved(self) -> list[str]:
        states = json.loads(self.segments.numpy().decode())
        if len(states) != self._count:
            if len(set(states)) != 1:
                raise ConfigError(
                    f"train.run_dir: the checkpoint holds the mixture weights of {len(states)} input pipeline(s) (hosts), "
                    f"and this run has {self._count}; resume it on as many hosts, or start a new train.run_dir")
            states = states[:1] * self._count  # every pipeline the same (the weights never changed mid-window)
        return states

    def resume(self, place: Callable[[tf.distribute.InputContext], tuple[int, int, int]], num_replicas: int) -> list[str]:
        """After the checkpoint's restore: every input pipeline's pipeline continuing its saved weights, from
        `place(context)` = (example, chunk, outputs of its window delivered) of its stream; the lines that say
        what changed and after how many steps the new weights take effect (none: nothing changed)."""
        if self._dealt is not None:
            return self._dealt  # the new hosts' own mixtures begin afresh (`start_own`)
        lines, states = [], self._saved()
        for index, saved in enumerate(states):
            context = tf.distribute.InputContext(self._count, index, num_replicas)
            example, chunk, skip = place(context)
            if chunk == IN_REST:  # in rows dealt from another slice: its own mixture has not begun, nothing in flight
                source, message = self._pipeline.source.with_resume_state(saved, 0, 0, lambda switch: (
                    "from the first example of its own mixture, after the rows dealt from the earlier slice"))
                pipeline = self._pipeline.with_source(source)
            else:
                pipeline, message = resumed(self._pipeline, saved, context, example, chunk, skip,
                                            per_step=outputs_per_step(self._pipeline, context))
            self._pipelines[index] = pipeline
            states[index] = pipeline.source.resume_state()
            if message:
                lines.append(message if self._count == 1 else f"input pipeline {index} of {self._count}: {message}")
        self.segments.assign(json.dumps(states))
        return lines

    def pipeline(self, index: int) -> Pipeline:
        """The pipeline of input pipeline `index`: its saved weights continued (after `resume`), else the config's."""
        return self._pipelines.get(index, self._pipeline)
