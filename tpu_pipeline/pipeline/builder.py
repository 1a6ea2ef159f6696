"""The Pipeline: a source and its stages, built once per input pipeline (tf.distribute.InputContext).

What it does with them, reading them by their parts (`roles.Parts`, split once from the list: what is
built once, per epoch, the repeat, the stream; the windowed stage, the batch, the outputs, the service
split by name): the epochs (stages before a `Repeat` built per epoch, so they know it; those up to a
cache once), the resume (examples delivered → (epoch, offset), the epoch rebuilt and the
offset skipped before any parse), the stream through tf.data service workers, and bucketing with
several input pipelines. Which stages a config gives, in which order, is `stage_assembly`'s
(following the plan made once in `plan`); the source, `source_factory`'s; evaluation's rewrite,
`evaluation`'s; `on_error: skip`'s clean source, `bad_records`'.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence, Union

import tensorflow as tf

from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.format.vocabulary import Vocabulary
from tpu_pipeline.pipeline.checks.bad_records import SkipReport, check_copies_reachable, without_bad_records
from tpu_pipeline.pipeline.checks.empty_check import first_records
from tpu_pipeline.pipeline.checks.spec_check import check_first_record
from tpu_pipeline.pipeline.checks.tpu_check import check_tpu_compatible
from tpu_pipeline.pipeline.core import seeds
from tpu_pipeline.pipeline.core.remainder import Remainder
from tpu_pipeline.pipeline.core.resume_position import INDEX_KEY
from tpu_pipeline.pipeline.core.row_remainder import RowRemainder
from tpu_pipeline.pipeline.data_errors import NamingDataErrors
from tpu_pipeline.pipeline.dealt import (dealt_rows_then_own, mixed_share, records_share, skip_examples,
                                        take_examples)
from tpu_pipeline.pipeline.mixtures.mixture_weights import by_tokens
from tpu_pipeline.pipeline.plan import Plan, make_plan
from tpu_pipeline.pipeline.runtime.device_buffers import untune_device_buffers
from tpu_pipeline.pipeline.runtime.iterator import DistributedPipelineIterator, PipelineIterator
from tpu_pipeline.pipeline.sequences.modes.base import SequenceMode
from tpu_pipeline.pipeline.sequences.modes.registry import sequence_mode
from tpu_pipeline.pipeline.sequences.sequence_stages import Windowed
from tpu_pipeline.pipeline.source_factory import source_from_config
from tpu_pipeline.pipeline.sources.base import RecordFileSource, Source
from tpu_pipeline.pipeline.stage_assembly import stages_from_plan
from tpu_pipeline.pipeline.stages.base import Stage, StageContext
from tpu_pipeline.pipeline.stages.batching import per_replica_batch_size
from tpu_pipeline.pipeline.stages.evaluation import evaluation_steps, for_evaluation
from tpu_pipeline.pipeline.stages.outputs import SplitPosition
from tpu_pipeline.pipeline.stages.roles import CACHE, Parts, roles_of, split_by_roles
from tpu_pipeline.pipeline.stages.service_split import ServiceSplit

FIRST_EPOCH = 0


def apply_stages(dataset: tf.data.Dataset, stages: Sequence[Stage], context: StageContext) -> tf.data.Dataset:
    """Applies `stages` in order, each the same way: `apply(dataset, context)`, then the context the
    next stage sees is `stage.after(context)` (after a Batch, a resumed position counts batches)."""
    for stage in stages:
        dataset = stage.apply(dataset, context)
        context = stage.after(context)
    return dataset


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A source and the stages after it. `build(ctx)` makes the dataset for one input pipeline.

    A `Repeat` stage splits the stages in two: those before it make one epoch (built per epoch,
    so file order and shuffles get that epoch's seeds), those after it run on the stream of
    epochs. Stages up to a `Cache` (and a source that caches its records) are built once: the
    cache fills in the first epoch and replays it after. `parts` holds that split, made once here
    from `stages` (`roles.split_by_roles`, by the roles the stages declare), and names the stages other code
    needs: `windowed`, `batch`, `outputs`, `service`.
    """

    source: Source
    stages: Sequence[Any] = ()
    check_tpu: bool = False
    plan: Optional[Plan] = None
    skipped: Optional[SkipReport] = None  # with data.on_error=skip: the records left out, by kind and file
    # From `from_config`: what naming a data error scans (None: a pipeline of Python parts, nothing to scan).
    config: Optional[DataConfig] = dataclasses.field(default=None, repr=False, compare=False)
    prefix: str = "data"  # the config key errors name (data, eval_data)
    num_classes: Optional[int] = None
    vocab: Optional[Vocabulary] = None  # the config's token vocabulary, for files whose metadata.json has none
    parts: Parts = dataclasses.field(init=False, repr=False, compare=False)  # `stages` by part, split once

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", split_by_roles(self.stages))

    def with_parts(self, parts: Parts) -> "Pipeline":
        """This pipeline with its stages rewritten by part (`Parts.replaced`, `Parts.inserted`)."""
        return dataclasses.replace(self, stages=parts.stages)

    def with_stage(self, stage: Stage, *, before: Optional[str] = None, after: Optional[str] = None) -> "Pipeline":
        """This pipeline with `stage` inserted before or after a named part (`outputs`, `service`, ...:
        `roles.NAMED`), or at the end where that part is absent."""
        return self.with_parts(self.parts.inserted(stage, before=before, after=after))

    def build(self, input_context: Optional[tf.distribute.InputContext] = None, start: int = 0, skip: int = 0,
              with_position: bool = False, chunk: int = 0,
              remainder: Optional[Union[Remainder, RowRemainder]] = None) -> tf.data.Dataset:
        """The dataset of one input pipeline; `start`: examples it delivered before (a resume).

        A resumed stream is exactly the rest of the uninterrupted one: the epochs are pure
        functions of (seed, epoch, pipeline), so the pipeline rebuilds epoch start // L (L: the
        epoch length of this pipeline) and skips start % L records of it before any parse or op.

        A windowed pipeline (data.sequence bucket or pack: `self.windowed`) resumes at a window:
        `start` is the example where it starts (bucket: a multiple of the window), `chunk` the
        chunks of that example before it (pack), `skip` its outputs delivered before.
        `with_position`: each element comes as (element, position), the position being the
        `resume_position.POSITION_KEYS` of its outputs (what the iterators save).

        `remainder` (`core.remainder.Remainder`: a resume on another number of input pipelines): this
        pipeline's share of what the old layout's pipelines had left of their epoch, then its own epochs
        from the next; `start` is then its stream position where its share begins (`Remainder.start`).
        A packed stream's `RowRemainder` (`dealt`): (start, chunk, skip) is its place, in the dealt rows or its own.
        """
        context = input_context or tf.distribute.InputContext()
        parts = self._parts_with_position(with_position)
        mode = self.sequence_mode
        if isinstance(remainder, RowRemainder):  # a packed stream's rest, dealt in rows (`dealt`)
            # a mixture's own stream starts at 0, each source at its first epoch (`MixtureSource.first_epochs`)
            own_start = 0 if remainder.states else (remainder.epoch + 1) * self._epoch_length(context, start)
            rows = dealt_rows_then_own(self, parts.until("windowed", inclusive=True), context, remainder,
                                       (start, chunk, skip), own_start)
            dataset = apply_stages(rows, parts.following("windowed"), StageContext(context))
        elif remainder is not None and not self.deals_remainders:
            raise ValueError("only a pipeline of examples from a source with epochs, without a window or "
                             "tf.data service, can deal another layout's remainder (deals_remainders)")
        elif mode is not None and mode.shares_stream(context):
            dataset = self._shared_buckets(parts, context, start, skip, chunk)
        elif parts.service is None:
            dataset = self._stream(parts, context, start, skip_outputs=skip, chunk=chunk, remainder=remainder)
        else:  # no position through the service: a resume there restarts at an epoch (`service_restart`)
            dataset = self._through_service(self.parts, context, start)
        if self.check_tpu:
            outputs = self.parts.outputs
            names = {} if outputs is None else {
                position: key for position, key in (("inputs", getattr(outputs, "inputs", None)),
                                                    ("targets", getattr(outputs, "targets", None)))
                if isinstance(key, str)}
            sequence = self.plan.sequence.value if self.plan is not None else None
            check_tpu_compatible(dataset, names, tuple(self.windowed.keys) if mode is not None and mode.length_varies else (),
                                 sequence_lengths=(sequence.lengths if sequence else {}) if self.plan else None,
                                 bucket_lengths=sequence.bucket_lengths if sequence else (),
                                 replicas=context.num_replicas_in_sync, prefix=self.prefix)
        return dataset

    @property
    def sequence_mode(self) -> Optional[SequenceMode]:
        """The data.sequence mode the plan chose (pad, bucket, pack: tpu_pipeline.pipeline.sequences.modes),
        or for a pipeline built by hand the mode of its windowed stage; None without either."""
        sequence = self.plan.sequence.value if self.plan is not None else None
        if sequence is not None:
            return sequence_mode(sequence.mode)
        return sequence_mode(self.windowed.mode_name) if self.windowed is not None else None

    @property
    def deals_remainders(self) -> bool:
        """True: a resume on another number of input pipelines can go on exactly (`build(remainder=...)`):
        a stream of examples (no window: its place is computed from the step), of a source of epochs or a
        mixture (whose sources' epochs are dealt: `MixedRemainder`), and not through tf.data service."""
        return self.parts.windowed is None and self.parts.service is None

    @property
    def windowed(self) -> Optional[Windowed]:
        """The bucket or pack stage (data.sequence), whose windows are the unit of a resume; None otherwise."""
        return self.parts.windowed

    def _parts_with_position(self, with_position: bool) -> Parts:
        """The parts, a windowed pipeline's position kept beside each element (`with_position`) or
        dropped: by its outputs, or without any by a `SplitPosition` where the batches leave."""
        parts = self.parts
        if parts.windowed is None:
            return parts
        if parts.outputs is not None:
            return parts.replaced(outputs=dataclasses.replace(parts.outputs, position=with_position))
        return parts.inserted(SplitPosition(with_position), before="service" if parts.service is not None else "prefetch")

    def _shared_buckets(self, parts: Parts, context: tf.distribute.InputContext, start: int,
                        skip: int, chunk: int = 0) -> tf.data.Dataset:
        """Bucketing with several input pipelines (hosts): every replica of a step, on every host, must get
        the same shape, and a host cannot see the others' lengths. So every input pipeline reads the whole
        stream (as one pipeline would), buckets it into groups of all replicas' batches, and keeps the
        batches of its own replicas: each host parses every record (the price), every step has one
        shape, and each example reaches exactly one replica."""
        shared = tf.distribute.InputContext(1, 0, context.num_replicas_in_sync)
        everything = self._stream(parts.until("windowed", inclusive=True), shared, start, skip_outputs=skip, chunk=chunk)
        mine = context.num_replicas_in_sync // context.num_input_pipelines
        index = context.input_pipeline_id

        def kept(features: Any) -> tf.Tensor:
            return tf.equal(features[INDEX_KEY] % context.num_replicas_in_sync // mine, index)

        return apply_stages(everything.filter(kept), parts.following("windowed"), StageContext(context))

    @property
    def service(self) -> Optional[ServiceSplit]:
        """Where this pipeline leaves for tf.data service workers (data.service), or None."""
        return self.parts.service

    def service_restart(self, examples: int) -> tuple[int, int]:
        """Through the service, a stream resumed after `examples` (all hosts together) restarts at the
        start of an epoch: (that epoch, examples of it delivered twice)."""
        split = self.service
        assert split is not None, "service_restart: this pipeline does not use data.service"
        return self._resume_point(split.worker_context(tf.distribute.InputContext()), examples)

    def _through_service(self, parts: Parts, context: tf.distribute.InputContext, start: int) -> tf.data.Dataset:
        """The stages before the service split on the tf.data service workers (with the options), the rest here.

        The service decides which worker makes which batch and which consumer gets it, so a resumed
        stream cannot be the exact rest of the interrupted one: it starts a fresh job at the start
        of the epoch the run stopped in (the step count, schedule and checkpoints stay exact).
        """
        split = parts.service
        workers = split.worker_context(context)
        first_epoch = 0
        if start:
            # `start` counts this host's examples; every host consumed as many from the one job.
            first_epoch, _ = self._resume_point(workers, start * context.num_input_pipelines)
        salted = split.mode == "parallel_epochs"  # each worker its own file order and shuffles
        on_workers = parts.until("service")
        if parts.options is not None and parts.options in parts.following("service"):
            on_workers = on_workers.inserted(parts.options)
        dataset = self._stream(on_workers, workers, first_epoch=first_epoch, salted=salted)
        return apply_stages(dataset, (split, *parts.following("service")), StageContext(context, first_epoch=first_epoch))

    def _stream(self, parts: Parts, context: tf.distribute.InputContext, start: int = 0,
                first_epoch: Optional[int] = None, salted: bool = False, skip_outputs: int = 0,
                chunk: int = 0, remainder: Optional[Remainder] = None, stop: Optional[int] = None) -> tf.data.Dataset:
        """`parts` after the source, epoch by epoch; from example `start` (exactly), or from the
        beginning of `first_epoch`, or this pipeline's share of another layout's `remainder` and then
        its epochs from the next (`start` then counts the examples before its share); `stop`: the records end at
        that stream position (a packed stream's rest, `dealt.rows_left`). `salted`: each run
        of the graph (each service worker) folds a value of its own into the epoch, hence into every
        per-epoch seed."""
        once, each = parts.once, parts.epoch
        if self.source.seekable:
            # A source that positions itself (a mixture: each of its sources at its own epoch and
            # record) has no epochs for the repeat to make: its sources repeat, or end, on their own.
            epoch = StageContext(context, epoch=tf.constant(FIRST_EPOCH, tf.int64))
            mixed = self.source.build_from(context, start if remainder is None else 0)
            if remainder is not None:  # its share of the old pipelines' rest, then its own mixture from its start
                mixed = mixed_share(self, context, remainder).concatenate(mixed)
            dataset = apply_stages(mixed, (*once, *each), epoch)
            return apply_stages(dataset, parts.stream, StageContext(context, examples=start, skip=skip_outputs,
                                                                    chunk=chunk))
        one_epoch, differ = self._epochs(parts, context, salted)
        start_epoch, head = FIRST_EPOCH, None
        if remainder is not None:
            start_epoch = remainder.epoch + 1  # after this pipeline's share of the rest, its own layout's epochs
        elif first_epoch:
            start_epoch, head = first_epoch, lambda dataset: dataset  # noqa: E731
        elif start:
            start_epoch, skip = self._resume_point(context, start)
            head = lambda dataset: skip_examples(dataset, skip)  # noqa: E731
        if parts.repeat is not None:
            dataset = parts.repeat.epochs(one_epoch, differ, first=start_epoch, head=head)
        else:
            dataset = one_epoch(tf.constant(start_epoch, tf.int64))
            dataset = head(dataset) if head else dataset
        if stop is not None:
            dataset = take_examples(dataset, max(0, stop - start))
        if remainder is not None:
            share = records_share(self, parts, context, remainder)
            dataset = share if parts.repeat is None else share.concatenate(dataset)
        resumed = StageContext(context, examples=0 if first_epoch is not None else start, skip=skip_outputs, chunk=chunk)
        return apply_stages(dataset, parts.stream, resumed)

    def _epochs(self, parts: Parts, context: tf.distribute.InputContext, salted: bool = False,
                cached: bool = True) -> tuple[Callable[[tf.Tensor], tf.data.Dataset], bool]:
        """(`one_epoch(e)`: input pipeline `context`'s epoch e through the stages before the repeat, whether
        the epochs differ). Epochs that differ (file order, shuffle seeds) are built one by one; otherwise
        the same epoch is repeated, which tf.data runs faster (benchmarks/bench_epochs.py). `cached=False`:
        the same elements with no cache stage (a pipeline read for part of an epoch, that writes no cache)."""
        once, each = parts.once, parts.epoch
        source_per_epoch = self.source.per_epoch and not once
        if not cached:
            once = tuple(stage for stage in once if CACHE not in roles_of(stage))
        if source_per_epoch:
            one_epoch = lambda epoch: apply_stages(  # noqa: E731
                self.source.build(context, epoch), each, StageContext(context, epoch=epoch))
        else:
            first = apply_stages(self.source.build(context, tf.constant(FIRST_EPOCH, tf.int64)), once,
                                 StageContext(context))
            one_epoch = lambda epoch: apply_stages(first, each, StageContext(context, epoch=epoch))  # noqa: E731
        if salted:
            # Inside a dataset function, so the salt is drawn where the graph runs, not here.
            unsalted = one_epoch
            one_epoch = lambda epoch: tf.data.Dataset.from_tensors(epoch).flat_map(  # noqa: E731
                lambda e: unsalted(e + seeds.runtime_salt()))
        differ = salted or source_per_epoch or any(getattr(stage, "uses_epoch", False) for stage in each)
        return one_epoch, differ

    def _resume_point(self, context: tf.distribute.InputContext, start: int) -> tuple[int, int]:
        """(epoch, examples of it to skip) for a stream that delivered `start` examples."""
        return divmod(start, self._epoch_length(context, start))

    def _epoch_length(self, context: tf.distribute.InputContext, start: int) -> int:
        """Input pipeline `context`'s epoch length; one line naming the fix where the source has none."""
        length = self.source.epoch_length(context)
        if not length:
            raise ConfigError(
                f"cannot resume input pipeline {context.input_pipeline_id} at example {start}: its source "
                f"({type(self.source).__name__}) has no fixed epoch length with this sharding; use "
                "data.source.sharding=auto (balanced) on TFRecord files or arrays"
            )
        return length

    def with_source(self, source: Source) -> "Pipeline":
        """This pipeline reading `source` (e.g. a mixture restored with the weights of a checkpoint)."""
        return dataclasses.replace(self, source=source)

    def global_batch_size(self) -> int:
        """The global batch: of examples, of packed rows (pack), or each bucket's nominal batch (bucket)."""
        if self.parts.batch is None:
            raise ConfigError("a pipeline without a batch stage has no steps to resume from")
        return self.parts.batch.global_batch_size

    def examples_per_batch(self, context: tf.distribute.InputContext) -> int:
        """Examples in one element of this pipeline: a replica's share of the global batch."""
        return per_replica_batch_size(self.global_batch_size(), context)

    def examples_per_step(self, context: tf.distribute.InputContext) -> int:
        """Examples one input pipeline delivers per global step: the shares of the replicas it feeds
        (a strategy hands each replica the pipeline's next element in turn)."""
        return self.examples_per_batch(context) * (context.num_replicas_in_sync // max(1, context.num_input_pipelines))

    def iterator(self, input_context: Optional[tf.distribute.InputContext] = None) -> "PipelineIterator":
        """An iterator over one input pipeline's batches that `tf.train.Checkpoint` saves and
        restores by position (a few bytes, never the buffered elements)."""
        return PipelineIterator(self, input_context)

    def distributed_iterator(self, strategy: tf.distribute.Strategy) -> "DistributedPipelineIterator":
        """An iterator over global steps of `strategy`'s distributed dataset, saved and restored by position."""
        return DistributedPipelineIterator(self, strategy)

    def naming_data_errors(self) -> NamingDataErrors:
        """A context manager that turns TensorFlow's anonymous data errors raised inside it into one line
        naming the file and record at fault, and the fix:

            with pipeline.naming_data_errors():
                model.fit(pipeline.distribute(strategy), epochs=1, steps_per_epoch=10)

            with pipeline.naming_data_errors():
                for batch in pipeline.build():
                    ...

        With `data.on_error: raise`, a damaged record (a JPEG that does not decode, a bad CRC, a missing
        feature) fails inside TF with no file named (`jpeg::Uncompress failed ... [[{{node DecodeJpeg}}]]`).
        On such an error (`InvalidArgumentError`, `DataLossError`, `FailedPreconditionError`) this scans
        the pipeline's files with `verify`'s checks, stopping at the first fault (the error path pays,
        the fast path is untouched), and raises `DataError` (`from None`):
        `data: FILE, record N (byte B): what is wrong; the fix (TensorFlow said: ...); list every fault
        with: tpu-pipeline verify --config ...`. Every other exception, and a data error whose fault the
        scan does not find (or a pipeline not built by `from_config`), passes through unchanged.
        `iterator()` and `distributed_iterator()` do this themselves.
        """
        return NamingDataErrors(self.config, self.prefix, self.num_classes, self.source, self.vocab)

    def for_evaluation(self) -> "Pipeline":
        """This pipeline for exact evaluation: every record of one pass, split between input pipelines
        without leaving any out; the last batch padded and later steps filled with zero-weight
        examples (`PadToSteps`), so shapes stay static and each example counts exactly once.

        Packed input: how many rows a pass makes depends on the data, so the rows of each input
        pipeline are counted by one pass when the steps are first asked for (padding rows have
        segment ids 0 and weight 0; every token counts once). Bucketed input pads itself: each
        bucket's last group of batches is filled with padding examples, and with several input
        pipelines every one makes the same steps; `example_mask` becomes the weights."""
        return for_evaluation(self)

    def evaluation_steps(self, num_replicas: int, num_input_pipelines: int = 1) -> int:
        """Steps of one exact evaluation pass of `for_evaluation()`'s pipeline (the same on every
        input pipeline: one per host under a strategy)."""
        return evaluation_steps(self.parts, num_replicas, num_input_pipelines)

    def dataset_fn(self) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
        """For `strategy.distribute_datasets_from_function`."""
        return self.build

    def distribute(self, strategy: tf.distribute.Strategy,
                   check: Optional[Callable[[Any], None]] = None) -> Any:
        """The per-replica dataset for `strategy` (one `build` per input pipeline). Its iterators' per-device
        buffers run without tf.data's autotuner (`runtime/device_buffers.py`, installed when this module is
        imported, so also for `strategy.distribute_datasets_from_function` called directly). `check`: called
        with each built dataset's element_spec (to refuse what a model cannot take without building it again)."""
        untune_device_buffers()

        def build(context: tf.distribute.InputContext) -> tf.data.Dataset:
            dataset = self.build(context)
            if check is not None:
                check(dataset.element_spec)
            return dataset

        return strategy.distribute_datasets_from_function(build)

    @classmethod
    def from_config(cls, config: DataConfig, *, target: str = "cpu", source: Optional[Source] = None,
                    prefix: str = "data", num_classes: Optional[int] = None,
                    vocab: Optional[Vocabulary] = None) -> "Pipeline":
        """The pipeline a config describes, planned once. `target='tpu'` adds the TPU check.

        `source` replaces the config's source, e.g. `ArraySource(arrays)` from Python; `prefix` is
        the config key errors name (data, eval_data); `num_classes`, where known, lets
        `on_error: skip` check labels, and `vocab` (`vocabularies.config_vocabulary(config)`) token ids
        where the dataset's metadata.json names no tokenizer.
        """
        source = source or source_from_config(config, prefix)
        skipped = None
        if config.on_error == "skip" and isinstance(source, RecordFileSource):
            source, skipped = without_bad_records(config, source, prefix, num_classes, vocab)
            check_copies_reachable(config, skipped, prefix)
        # A source with no record is refused here in one line (its epochs would be empty, and a stream of
        # empty epochs never yields): from its listed counts or its first record, what the check below reads.
        found = first_records(source, prefix) if isinstance(source, RecordFileSource) else ()
        plan = make_plan(config, source, prefix)
        if config.mixture is not None and config.mixture.weight_by == "tokens" and source.names:  # (not a stand-in)
            source = by_tokens(source, plan.features.value, plan.sequence.value)
        if plan.features.value and isinstance(source, RecordFileSource) and skipped is None:
            check_first_record(source, plan.features.value, prefix, plan.source_features, found)
        return cls(source=source.with_read(plan.read), stages=stages_from_plan(config, plan, prefix),
                   check_tpu=target == "tpu", plan=plan, skipped=skipped, config=config, prefix=prefix,
                   num_classes=num_classes, vocab=vocab)


def build_dataset(
    config: DataConfig, input_context: Optional[tf.distribute.InputContext] = None, *, target: str = "cpu"
) -> tf.data.Dataset:
    """Shortcut: the dataset for one input pipeline described by `config`."""
    return Pipeline.from_config(config, target=target).build(input_context)
