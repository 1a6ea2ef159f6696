"""What `train` adds to a data.sequence stream: a tokens/s meter, and the windowed stream through data.service
(with what a resume through the service says, windowed or not).

Both rewrite or rebuild a `Pipeline` without changing what it delivers: the meter is one more stage
that counts (non-padding tokens), and the service stream restarts where a step count can place it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import tensorflow as tf
from absl import logging

from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.pipeline.sequences.token_count import TokenMeter, sequence_keys
from tpu_pipeline.pipeline.stages.base import Stage, StageContext


def with_token_meter(pipeline: Pipeline) -> tuple[Pipeline, Optional[TokenMeter]]:
    """A data.sequence pipeline with a TokenMeter (tokens/s, non-padding), counted where the masks and
    segment ids still are: before the outputs pick the model's keys; with data.service (whose workers
    cannot reach this host's counters) where the batches arrive, if the outputs kept them."""
    if pipeline.plan is None or pipeline.plan.sequence.value is None:
        return pipeline, None
    tokens = TokenMeter()
    if pipeline.service is None:
        return pipeline.with_stage(tokens, before="outputs"), tokens
    arriving = pipeline.with_parts(pipeline.parts.until("service")).build().element_spec
    if not sequence_keys(arriving):
        logging.info("data.service: the outputs keep no <key>_segment_ids or <key>_mask; tokens/s is not measured")
        return pipeline, None
    return pipeline.with_stage(_WholeElements(tokens), after="service"), tokens


@dataclasses.dataclass(frozen=True)
class _WholeElements(Stage):
    """A stage that hands `stage` each element whole: tf.data spreads a tuple element (Keras's
    (inputs, targets, weights) after the outputs) over a map's arguments."""

    stage: Any

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        nested = dataset.map(lambda *parts: (parts if len(parts) > 1 else parts[0],), name="whole_elements")
        return self.stage.apply(nested, context)


def windowed_service_stream(pipeline: Pipeline, context: tf.distribute.InputContext,
                             taken_steps: int) -> tf.data.Dataset:
    """A windowed stream through data.service, from the start of the data (a step does not say how many
    examples it held). An anonymous job is fresh for every dataset, so a later `fit` call of the same
    run skips the `taken_steps` steps its earlier one took; a named job is shared, and joining it again
    goes on where it is."""
    dataset = pipeline.build(context)
    if pipeline.service.job_name is not None or taken_steps <= 0:
        return dataset
    return dataset.skip(taken_steps * (context.num_replicas_in_sync // max(1, context.num_input_pipelines)))


def service_resume_line(pipeline: Pipeline, step: int, global_batch: int) -> str:
    """Where a stream through data.service resumes after `step` steps, as `train`'s resume line says it: the
    service decides which worker makes which batch, so a resume is a fresh job, never the exact rest."""
    if pipeline.windowed is not None:
        return (f"data.service cannot resume a data.sequence {pipeline.sequence_mode} stream exactly (a step does "
                "not say how many examples its rows held), so the input starts a fresh service job at the start of "
                f"the data (data epoch 1): what the {step:,} step(s) before trained on comes again")
    data_epoch, again = pipeline.service_restart(step * global_batch)
    return (f"data.service cannot resume exactly, so the input starts a fresh service job at the start of data epoch "
            f"{data_epoch + 1}" + (f": {again:,} examples of it come again" if again else ""))
