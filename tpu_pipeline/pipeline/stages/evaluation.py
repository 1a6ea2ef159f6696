"""A pipeline rewritten for exact evaluation: every example of one pass once, with static shapes.

Padding with zero-weight examples keeps TPU shapes static (`PadToSteps`, the one stage evaluation
adds); only weighted metrics ignore the padding. How many steps a pass makes is the epoch length
for images; for packed or bucketed input it depends on the data, so it is counted by one pass
(`_CountedRows`). The builder only delegates here: `Pipeline.for_evaluation`, `.evaluation_steps`.
Every rewrite is of a named part (`roles.Parts`: the batch, the repeat, the outputs, the steps).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Optional, Protocol, Sequence, TypeVar, Union

import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.core import seeds
from tpu_pipeline.pipeline.core.element_keys import EXAMPLE_MASK
from tpu_pipeline.pipeline.sources.base import RecordFileSource, Source
from tpu_pipeline.pipeline.stages.base import Stage, StageContext
from tpu_pipeline.pipeline.stages.batching import per_replica_batch_size
from tpu_pipeline.pipeline.stages.roles import Parts


class EvaluatedPipeline(Protocol):
    """What evaluation reads of a `builder.Pipeline` (a frozen dataclass it rewrites with `dataclasses.replace`)."""

    @property
    def source(self) -> Source: ...

    @property
    def stages(self) -> Sequence[Any]: ...

    @property
    def parts(self) -> Parts: ...

    @property
    def prefix(self) -> str: ...

    @property
    def sequence_mode(self) -> Any: ...  # a modes.base.SequenceMode, or None (evaluation imports no mode)

    def build(self, input_context: Optional[tf.distribute.InputContext] = None) -> tf.data.Dataset: ...


PipelineT = TypeVar("PipelineT", bound=EvaluatedPipeline)


def for_evaluation(pipeline: PipelineT) -> PipelineT:
    """`pipeline` for exact evaluation (`Pipeline.for_evaluation` says what that is): as its sequence
    mode pads one (`SequenceMode.evaluation`), else padded to whole steps. A pipeline that mixes its
    batches (mixup, CutMix) is refused: an evaluation of mixed examples is not the model's."""
    if any(getattr(stage, "purpose", None) == seeds.AUGMENT_BATCH for stage in pipeline.stages):
        raise ConfigError(f"{pipeline.prefix}.augment: mixup_cutmix mixes examples and their labels, which an "
                          f"evaluation must never do; evaluate a pipeline without it (eval_data)")
    mode = pipeline.sequence_mode
    return mode.evaluation(pipeline) if mode is not None else padded_evaluation(pipeline)


def padded_evaluation(pipeline: PipelineT) -> PipelineT:
    """One pass, every record (cover_all), the last batch padded and whole zero batches added until
    every input pipeline gives the same steps (`PadToSteps`); a windowed stream's rows counted by a pass."""
    parts = pipeline.parts
    if parts.batch is None or getattr(parts.outputs, "targets", None) is None:
        raise ConfigError("eval_data: evaluation needs a batch and outputs with targets (eval_data.outputs)")
    if parts.repeat is not None and parts.repeat.count != 1:
        raise ConfigError("eval_data.repeat: evaluation reads one pass; set eval_data.repeat: 1")
    source = pipeline.source
    if isinstance(source, RecordFileSource):
        sharding = "balanced" if source.read.sharding in ("auto", "balanced") else source.read.sharding
        if sharding != "balanced":
            raise ConfigError(f"eval_data.source.sharding={sharding}: exact evaluation splits records evenly; "
                              "use sharding: auto")
        source = source.with_read(dataclasses.replace(source.read, cover_all=True, sharding=sharding))
    unpadded = parts.replaced(batch=dataclasses.replace(parts.batch, drop_remainder=False))
    share = source.epoch_length
    # Rows of a packed pass, or the examples of a source with no epochs of its own (a mixture: its
    # sources end their own ways), are counted by one pass.
    if parts.windowed is not None or source.seekable:
        share = _CountedRows(dataclasses.replace(pipeline, source=source, stages=unpadded.stages))
    pad = PadToSteps(parts.batch.global_batch_size, share)
    return dataclasses.replace(pipeline, source=source, stages=unpadded.inserted(pad, after="outputs").stages)


def bucketed_evaluation(pipeline: PipelineT) -> PipelineT:
    """for_evaluation of a bucketed pipeline: one pass, every record (cover_all), weights from
    `example_mask`, steps counted by a pass."""
    prefix, parts = pipeline.prefix, pipeline.parts
    outputs = parts.outputs
    if getattr(outputs, "targets", None) is None:
        raise ConfigError(f"{prefix}: evaluation needs outputs with targets ({prefix}.outputs)")
    if parts.repeat is not None and parts.repeat.count != 1:
        raise ConfigError(f"{prefix}.repeat: evaluation reads one pass; set {prefix}.repeat: 1")
    source = pipeline.source
    if isinstance(source, RecordFileSource):
        source = source.with_read(dataclasses.replace(source.read, cover_all=True))
    weighted = parts.replaced(outputs=dataclasses.replace(outputs, weights=_with_example_mask(outputs.weights)))
    counted = dataclasses.replace(pipeline, source=source, stages=weighted.stages)
    return dataclasses.replace(counted, stages=weighted.inserted(_CountedSteps(_CountedRows(counted))).stages)


def evaluation_steps(parts: Parts, num_replicas: int, num_input_pipelines: int = 1) -> int:
    """Steps of one exact evaluation pass of the parts `for_evaluation` made (the same on every input pipeline)."""
    pad = parts.steps
    if pad is None:
        raise ConfigError("evaluation_steps: call it on pipeline.for_evaluation()")
    return pad.steps(tf.distribute.InputContext(num_input_pipelines, 0, num_replicas))


@dataclasses.dataclass(frozen=True)
class PadToSteps(Stage):
    """Evaluation with static shapes where every example counts once: each (inputs, targets) batch
    gains a weight per example (1, or 0 for padding); the last partial batch is padded to full size
    with zeros, and whole zero batches follow until every input pipeline gives the same number of
    steps (a strategy takes one element per replica per step, from every pipeline alike).

    `share(context)`: the examples input pipeline `context` delivers in one pass. Keras weighs its
    `weighted_metrics` by the weights, so padding changes no metric.
    """

    roles: ClassVar[tuple[str, ...]] = ("steps",)
    global_batch_size: int
    share: Callable[[tf.distribute.InputContext], Optional[int]]

    def steps(self, context: tf.distribute.InputContext) -> int:
        """Global steps of one pass, the same on every input pipeline."""
        size = per_replica_batch_size(self.global_batch_size, context)
        per_pipeline = max(1, context.num_replicas_in_sync // max(1, context.num_input_pipelines))
        batches = []
        for index in range(context.num_input_pipelines):
            other = tf.distribute.InputContext(context.num_input_pipelines, index, context.num_replicas_in_sync)
            examples = self.share(other)
            if examples is None:
                raise ConfigError("eval_data: exact evaluation needs a source that knows its size per input pipeline "
                                  "(TFRecord files, a converted dataset, or arrays on one input pipeline)")
            batches.append(-(-examples // size))
        return max(1, -(-max(batches) // per_pipeline))

    def apply(self, dataset: tf.data.Dataset, stage_context: StageContext) -> tf.data.Dataset:
        context = stage_context.input
        size = per_replica_batch_size(self.global_batch_size, context)
        per_pipeline = max(1, context.num_replicas_in_sync // max(1, context.num_input_pipelines))
        mine = -(-self.share(context) // size)
        extra = self.steps(context) * per_pipeline - mine

        def pad(inputs: Any, targets: Any, weights: Optional[tf.Tensor] = None) -> tuple[Any, Any, tf.Tensor]:
            count = tf.shape(tf.nest.flatten(targets)[0])[0]
            fill = lambda t: tf.ensure_shape(  # noqa: E731
                tf.pad(t, [[0, size - count]] + [[0, 0]] * (t.shape.rank - 1)), [size] + t.shape.as_list()[1:])
            if weights is None:
                weights = tf.ensure_shape(tf.concat([tf.ones([count]), tf.zeros([size - count])], 0), [size])
            else:  # the data's own weights (per token, say): the padding rows get 0
                weights = fill(weights)
            return tf.nest.map_structure(fill, inputs), tf.nest.map_structure(fill, targets), weights

        padded = dataset.map(pad, name="pad_to_steps")
        if extra <= 0:
            return padded
        zeros = tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), padded.element_spec)
        return padded.concatenate(tf.data.Dataset.from_tensors(zeros).repeat(extra))


@dataclasses.dataclass(frozen=True)
class _CountedSteps(Stage):
    """A bucketed evaluation's steps, from its batches counted by one pass (the dataset is unchanged:
    each bucket's last group is padded already, and input pipelines bucket the same stream)."""

    roles: ClassVar[tuple[str, ...]] = ("steps",)
    batches: "_CountedRows"  # counts batches here: each element is one batch of a bucket

    def steps(self, context: tf.distribute.InputContext) -> int:
        per_pipeline = max(1, context.num_replicas_in_sync // max(1, context.num_input_pipelines))
        return max(1, -(-self.batches(context, count="elements") // per_pipeline))

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        return dataset


def _with_example_mask(weights: Union[str, Sequence[str], None]) -> Union[str, list[str]]:
    """A bucketed evaluation's weights: the example mask, times the data's own (per-token) weights."""
    if weights is None:
        return EXAMPLE_MASK
    return [EXAMPLE_MASK, *([weights] if isinstance(weights, str) else weights)]


class _CountedRows:
    """Rows one pass of a packed pipeline delivers to input pipeline `context`, counted by running it
    once (remembered per context): what `PadToSteps` needs to pad every pipeline to the same steps."""

    def __init__(self, pipeline: EvaluatedPipeline) -> None:
        # The counting pass is unpadded (its last batch partial) and never reaches a device: no TPU check
        # there, or exact evaluation of packed rows or a mixture with target="tpu" fails before its first step.
        checked = getattr(pipeline, "check_tpu", False)
        self._pipeline = dataclasses.replace(pipeline, check_tpu=False) if checked else pipeline
        self._counts: dict[tuple[int, int, int, str], int] = {}

    def __call__(self, context: tf.distribute.InputContext, count: str = "rows") -> int:
        """Rows (the batches' first dimensions added up), or `count='elements'`: batches."""
        key = (context.num_input_pipelines, context.input_pipeline_id, context.num_replicas_in_sync, count)
        if key not in self._counts:
            sizes = self._pipeline.build(context).map(
                lambda *element: tf.shape(tf.nest.flatten(element)[0])[0] if count == "rows" else tf.constant(1))
            self._counts[key] = int(sizes.reduce(tf.constant(0), lambda total, size: total + size))
        return self._counts[key]
