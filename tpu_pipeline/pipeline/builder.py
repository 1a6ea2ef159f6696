"""Compose stages into a pipeline, built once per input pipeline (tf.distribute.InputContext).

Stage order from a config (why each sits where it does). Per-example parsing (any op works on
single examples, e.g. image decoding):

  source (list, shuffle, shard, interleave)
  → [with cache]  parse + preprocess → cache          (decode once, reuse every epoch)
  → shuffle                                           (raw records when there is no cache: far
                                                       smaller than decoded images in the buffer)
  → repeat                                            (epochs: everything above is one epoch, with
                                                       that epoch's file order and shuffle seeds)
  → [no cache] parse + preprocess, then augment, in ONE map (one thread crossing per element)
  → batch (per-replica share of the global batch, drop_remainder for static TPU shapes)
  → outputs (inputs, targets) → prefetch → tf.data.Options

Batch-then-parse (every op batchable, no cache; small records): the interleave moves blocks of
records, then window shuffle (one permutation per window of records) → repeat → cut batches of
serialized records → parse_example + every op on the whole batch in one parallel map. tf.data's
cost is per element, so this is ~10x faster for small records than per-example parsing, and the
window shuffle cuts the CPU per record by ~40% again against a per-record shuffle buffer.

Which of these the pipeline does is decided in tpu_pipeline.pipeline.plan, once; this module only
follows the plan.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional, Sequence, Union

import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.config.data import (
    SEQUENCE_KINDS, ArraySourceConfig, DataConfig, TFDSSourceConfig, TFRecordSourceConfig, service_host_port,
)
from tpu_pipeline.ops import build_ops
from tpu_pipeline.pipeline.bad_records import SkipReport, check_files
from tpu_pipeline.pipeline.data_errors import NamingDataErrors
from tpu_pipeline.pipeline.record_check import Vocabulary
from tpu_pipeline.pipeline.dataset_dir import DatasetDirSource
from tpu_pipeline.pipeline.options import make_options
from tpu_pipeline.pipeline.parse import make_parser
from tpu_pipeline.pipeline import seeds
from tpu_pipeline.pipeline.plan import Plan, SequencePlan, make_plan
from tpu_pipeline.pipeline.service_split import ServiceSplit
from tpu_pipeline.pipeline.source import RecordFileSource, Source
from tpu_pipeline.pipeline.spec_check import check_features, first_record
from tpu_pipeline.pipeline.sources import ArraySource, TFRecordSource
from tpu_pipeline.pipeline.iterator import DistributedPipelineIterator, PipelineIterator
from tpu_pipeline.pipeline.sequence import EXAMPLE_MASK, INDEX_KEY, Bucket, PackRows, Windowed, pad_batch, pad_example
from tpu_pipeline.pipeline.stages import (
    Batch, Cache, MapFeatures, PadToSteps, Prefetch, Repeat, Shuffle, SplitPosition, ToOutputs, WindowShuffle,
    WithOptions, per_replica_batch_size,
)
from tpu_pipeline.pipeline.tfds_source import TFDSSource
from tpu_pipeline.pipeline.tpu_check import check_tpu_compatible

FULL_SHUFFLE = tf.data.UNKNOWN_CARDINALITY  # a shuffle buffer that holds the whole (finite) input
FIRST_EPOCH = 0


def _apply(dataset: tf.data.Dataset, stages: Sequence[Any], context: tf.distribute.InputContext,
           epoch: Optional[tf.Tensor] = None, position: int = 0, skip: int = 0, chunk: int = 0) -> tf.data.Dataset:
    """Applies `stages`; `position`: examples delivered before (a resume), for stages that number
    their elements (per batch after a Batch stage; a windowed stage counts examples); `chunk`,
    `skip`: chunks of that example and outputs of a windowed stage's first window delivered before."""
    unit = 1
    for stage in stages:
        if getattr(stage, "uses_epoch", False):
            dataset = stage.apply(dataset, context, epoch=epoch)
        elif isinstance(stage, Windowed):
            dataset = stage.apply(dataset, context, position=position, chunk=chunk, skip=skip)
        elif getattr(stage, "uses_position", False):
            dataset = stage.apply(dataset, context, position=position // unit)
        else:
            dataset = stage.apply(dataset, context)
        if isinstance(stage, Batch):
            unit = stage.size(context)
    return dataset


def skip_examples(dataset: tf.data.Dataset, count: int) -> tf.data.Dataset:
    """The dataset without its first `count` examples, where elements may be vectors of serialized
    records (blocks or windows): those are cut at the record, never parsed."""
    if not count:
        return dataset
    spec = dataset.element_spec
    if isinstance(spec, tf.TensorSpec) and spec.dtype == tf.string and spec.shape.rank == 1:
        return dataset.unbatch().skip(count).batch(1024)
    return dataset.skip(count)


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A source and the stages after it. `build(ctx)` makes the dataset for one input pipeline.

    A `Repeat` stage splits the stages in two: those before it make one epoch (built per epoch,
    so file order and shuffles get that epoch's seeds), those after it run on the stream of
    epochs. Stages up to a `Cache` (and a source that caches its records) are built once: the
    cache fills in the first epoch and replays it after.
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

    def build(self, input_context: Optional[tf.distribute.InputContext] = None, start: int = 0, skip: int = 0,
              with_position: bool = False, chunk: int = 0) -> tf.data.Dataset:
        """The dataset of one input pipeline; `start`: examples it delivered before (a resume).

        A resumed stream is exactly the rest of the uninterrupted one: the epochs are pure
        functions of (seed, epoch, pipeline), so the pipeline rebuilds epoch start // L (L: the
        epoch length of this pipeline) and skips start % L records of it before any parse or op.

        A windowed pipeline (data.sequence bucket or pack: `self.windowed`) resumes at a window:
        `start` is the example where it starts (bucket: a multiple of the window), `chunk` the
        chunks of that example before it (pack), `skip` its outputs delivered before.
        `with_position`: each element comes as (element, position), the position being the
        `stages.POSITION_KEYS` of its outputs (what the iterators save).
        """
        context = input_context or tf.distribute.InputContext()
        stages = self._stages_with_position(with_position)
        split = self.service
        if isinstance(self.windowed, Bucket) and context.num_input_pipelines > 1:
            dataset = self._shared_buckets(stages, context, start, skip)
        elif split is None:
            dataset = self._stream(stages, context, start, skip_outputs=skip, chunk=chunk)
        else:
            dataset = self._through_service(split, context, start)
        if self.check_tpu:
            outputs = next((stage for stage in self.stages if isinstance(stage, ToOutputs)), None)
            names = {} if outputs is None else {
                position: key for position, key in (("inputs", outputs.inputs), ("targets", outputs.targets))
                if isinstance(key, str)}
            sequence = self.plan.sequence.value if self.plan is not None else None
            check_tpu_compatible(dataset, names, tuple(self.windowed.keys) if isinstance(self.windowed, Bucket) else (),
                                 sequence_lengths=(sequence.lengths if sequence else {}) if self.plan else None,
                                 bucket_lengths=sequence.bucket_lengths if sequence else (),
                                 replicas=context.num_replicas_in_sync, prefix=self.prefix)
        return dataset

    @property
    def windowed(self) -> Optional[Windowed]:
        """The bucket or pack stage (data.sequence), whose windows are the unit of a resume; None otherwise."""
        return next((stage for stage in self.stages if isinstance(stage, Windowed)), None)

    def _stages_with_position(self, with_position: bool) -> list[Any]:
        """The stages, a windowed pipeline's position kept beside each element (`with_position`) or dropped."""
        if self.windowed is None:
            return list(self.stages)
        stages = [dataclasses.replace(stage, position=with_position) if isinstance(stage, (ToOutputs, SplitPosition))
                  else stage for stage in self.stages]
        if not any(isinstance(stage, (ToOutputs, SplitPosition)) for stage in stages):
            at = next((i for i, stage in enumerate(stages) if isinstance(stage, (ServiceSplit, Prefetch))), len(stages))
            stages.insert(at, SplitPosition(with_position))
        return stages

    def _shared_buckets(self, stages: Sequence[Any], context: tf.distribute.InputContext, start: int,
                        skip: int) -> tf.data.Dataset:
        """Bucketing with several input pipelines (hosts): every replica of a step, on every host, must get
        the same shape, and a host cannot see the others' lengths. So every input pipeline reads the whole
        stream (as one pipeline would), buckets it into groups of all replicas' batches, and keeps the
        batches of its own replicas: each host parses every record (the price), every step has one
        shape, and each example reaches exactly one replica."""
        at = next(i for i, stage in enumerate(stages) if isinstance(stage, Bucket))
        shared = tf.distribute.InputContext(1, 0, context.num_replicas_in_sync)
        everything = self._stream(stages[:at + 1], shared, start, skip_outputs=skip)
        mine = context.num_replicas_in_sync // context.num_input_pipelines
        index = context.input_pipeline_id

        def kept(features: Any) -> tf.Tensor:
            return tf.equal(features[INDEX_KEY] % context.num_replicas_in_sync // mine, index)

        return _apply(everything.filter(kept), stages[at + 1:], context)

    @property
    def service(self) -> Optional[ServiceSplit]:
        """Where this pipeline leaves for tf.data service workers (data.service), or None."""
        return next((stage for stage in self.stages if isinstance(stage, ServiceSplit)), None)

    def service_restart(self, examples: int) -> tuple[int, int]:
        """Through the service, a stream resumed after `examples` (all hosts together) restarts at the
        start of an epoch: (that epoch, examples of it delivered twice)."""
        split = self.service
        assert split is not None, "service_restart: this pipeline does not use data.service"
        return self._resume_point(split.worker_context(tf.distribute.InputContext()), examples)

    def _through_service(self, split: ServiceSplit, context: tf.distribute.InputContext, start: int) -> tf.data.Dataset:
        """The stages before `split` on the tf.data service workers, the rest here.

        The service decides which worker makes which batch and which consumer gets it, so a resumed
        stream cannot be the exact rest of the interrupted one: it starts a fresh job at the start
        of the epoch the run stopped in (the step count, schedule and checkpoints stay exact).
        """
        at = list(self.stages).index(split)
        workers = split.worker_context(context)
        options = [stage for stage in self.stages[at + 1:] if isinstance(stage, WithOptions)]
        first_epoch = 0
        if start:
            # `start` counts this host's examples; every host consumed as many from the one job.
            first_epoch, _ = self._resume_point(workers, start * context.num_input_pipelines)
        salted = split.mode == "parallel_epochs"  # each worker its own file order and shuffles
        dataset = self._stream(list(self.stages[:at]) + options, workers, first_epoch=first_epoch, salted=salted)
        return _apply(split.apply(dataset, context, first_epoch), self.stages[at + 1:], context)

    def _stream(self, stages: Sequence[Any], context: tf.distribute.InputContext, start: int = 0,
                first_epoch: Optional[int] = None, salted: bool = False, skip_outputs: int = 0,
                chunk: int = 0) -> tf.data.Dataset:
        """`stages` after the source, epoch by epoch; from example `start` (exactly), or from the
        beginning of `first_epoch`. `salted`: each run of the graph (each service worker) folds a
        value of its own into the epoch, hence into every per-epoch seed."""
        cut = next((i for i, stage in enumerate(stages) if isinstance(stage, Repeat)), len(stages))
        before, after = list(stages[:cut]), list(stages[cut:])
        last_cache = max((i for i, stage in enumerate(before) if isinstance(stage, Cache)), default=-1)
        once, each = before[: last_cache + 1], before[last_cache + 1:]
        source_per_epoch = self.source.per_epoch and not once
        if source_per_epoch:
            one_epoch = lambda epoch: _apply(self.source.build(context, epoch), each, context, epoch)  # noqa: E731
        else:
            first = _apply(self.source.build(context, tf.constant(FIRST_EPOCH, tf.int64)), once, context)
            one_epoch = lambda epoch: _apply(first, each, context, epoch)  # noqa: E731
        if salted:
            # Inside a dataset function, so the salt is drawn where the graph runs, not here.
            unsalted = one_epoch
            one_epoch = lambda epoch: tf.data.Dataset.from_tensors(epoch).flat_map(  # noqa: E731
                lambda e: unsalted(e + seeds.runtime_salt()))
        start_epoch, head = FIRST_EPOCH, None
        if first_epoch:
            start_epoch, head = first_epoch, lambda dataset: dataset  # noqa: E731
        elif start:
            start_epoch, skip = self._resume_point(context, start)
            head = lambda dataset: skip_examples(dataset, skip)  # noqa: E731
        if after:
            # Epochs that differ (file order, shuffle seeds) are built one by one; otherwise the
            # same epoch is repeated, which tf.data runs faster (benchmarks/bench_epochs.py).
            differ = salted or source_per_epoch or any(getattr(stage, "uses_epoch", False) for stage in each)
            dataset, after = after[0].epochs(one_epoch, differ, first=start_epoch, head=head), after[1:]
        else:
            dataset = one_epoch(tf.constant(start_epoch, tf.int64))
            dataset = head(dataset) if head else dataset
        return _apply(dataset, after, context, position=0 if first_epoch is not None else start, skip=skip_outputs,
                      chunk=chunk)

    def _resume_point(self, context: tf.distribute.InputContext, start: int) -> tuple[int, int]:
        """(epoch, examples of it to skip) for a stream that delivered `start` examples."""
        length = self.source.epoch_length(context)
        if not length:
            raise ConfigError(
                f"cannot resume input pipeline {context.input_pipeline_id} at example {start}: its source "
                f"({type(self.source).__name__}) has no fixed epoch length with this sharding; use "
                "data.source.sharding=auto (balanced) on TFRecord files or arrays"
            )
        return divmod(start, length)

    def global_batch_size(self) -> int:
        """The global batch: of examples, of packed rows (pack), or each bucket's nominal batch (bucket)."""
        batches = [stage for stage in self.stages if isinstance(stage, (Batch, Bucket)) and getattr(stage, "per_replica", True)]
        if not batches:
            raise ConfigError("a pipeline without a batch stage has no steps to resume from")
        return batches[-1].global_batch_size

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
        if isinstance(self.windowed, Bucket):
            return self._bucketed_evaluation()
        batches = [stage for stage in self.stages if isinstance(stage, Batch) and stage.per_replica]
        repeats = [stage for stage in self.stages if isinstance(stage, Repeat)]
        outputs = [stage for stage in self.stages if isinstance(stage, ToOutputs)]
        if not batches or not outputs or outputs[0].targets is None:
            raise ConfigError("eval_data: evaluation needs a batch and outputs with targets (eval_data.outputs)")
        if any(stage.count != 1 for stage in repeats):
            raise ConfigError("eval_data.repeat: evaluation reads one pass; set eval_data.repeat: 1")
        source = self.source
        if isinstance(source, RecordFileSource):
            sharding = "balanced" if source.read.sharding in ("auto", "balanced") else source.read.sharding
            if sharding != "balanced":
                raise ConfigError(f"eval_data.source.sharding={sharding}: exact evaluation splits records evenly; "
                                  "use sharding: auto")
            source = source.with_read(dataclasses.replace(source.read, cover_all=True, sharding=sharding))
        unpadded = [dataclasses.replace(stage, drop_remainder=False) if isinstance(stage, Batch) else stage
                    for stage in self.stages]
        share = source.epoch_length
        if self.windowed is not None:
            share = _CountedRows(dataclasses.replace(self, source=source, stages=unpadded))
        pad = PadToSteps(batches[-1].global_batch_size, share)
        stages: list[Any] = []
        for stage in unpadded:
            stages.append(stage)
            if isinstance(stage, ToOutputs):
                stages.append(pad)
        return dataclasses.replace(self, source=source, stages=stages)

    def _bucketed_evaluation(self) -> "Pipeline":
        """for_evaluation of a bucketed pipeline: one pass, every record (cover_all), weights from
        `example_mask`, steps counted by a pass."""
        outputs = [stage for stage in self.stages if isinstance(stage, ToOutputs)]
        if not outputs or outputs[0].targets is None:
            raise ConfigError(f"{self.prefix}: evaluation needs outputs with targets ({self.prefix}.outputs)")
        if any(stage.count != 1 for stage in self.stages if isinstance(stage, Repeat)):
            raise ConfigError(f"{self.prefix}.repeat: evaluation reads one pass; set {self.prefix}.repeat: 1")
        source = self.source
        if isinstance(source, RecordFileSource):
            source = source.with_read(dataclasses.replace(source.read, cover_all=True))
        stages = [dataclasses.replace(stage, weights=_with_example_mask(stage.weights)) if isinstance(stage, ToOutputs)
                  else stage for stage in self.stages]
        counted = dataclasses.replace(self, source=source, stages=stages)
        return dataclasses.replace(counted, stages=[*stages, _CountedSteps(_CountedRows(counted))])

    def evaluation_steps(self, num_replicas: int, num_input_pipelines: int = 1) -> int:
        """Steps of one exact evaluation pass of `for_evaluation()`'s pipeline (the same on every
        input pipeline: one per host under a strategy)."""
        pad = next((stage for stage in self.stages if isinstance(stage, (PadToSteps, _CountedSteps))), None)
        if pad is None:
            raise ConfigError("evaluation_steps: call it on pipeline.for_evaluation()")
        return pad.steps(tf.distribute.InputContext(num_input_pipelines, 0, num_replicas))

    def dataset_fn(self) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
        """For `strategy.distribute_datasets_from_function`."""
        return self.build

    def distribute(self, strategy: tf.distribute.Strategy) -> Any:
        """The per-replica dataset for `strategy` (one `build` per input pipeline)."""
        return strategy.distribute_datasets_from_function(self.build)

    @classmethod
    def from_config(cls, config: DataConfig, *, target: str = "cpu", source: Optional[Source] = None,
                    prefix: str = "data", num_classes: Optional[int] = None,
                    vocab: Optional[Vocabulary] = None) -> "Pipeline":
        """The pipeline a config describes, planned once. `target='tpu'` adds the TPU check.

        `source` replaces the config's source, e.g. `ArraySource(arrays)` from Python; `prefix` is
        the config key errors name (data, eval_data); `num_classes`, where known, lets
        `on_error: skip` check labels, and `vocab` (`record_check.config_vocabulary(config)`) token ids
        where the dataset's metadata.json names no tokenizer.
        """
        source = source or source_from_config(config)
        skipped = None
        if config.on_error == "skip" and isinstance(source, RecordFileSource):
            source, skipped = without_bad_records(config, source, prefix, num_classes, vocab)
            check_copies_reachable(config, skipped, prefix)
        plan = make_plan(config, source, prefix)
        if plan.features.value and isinstance(source, RecordFileSource) and skipped is None:
            check_first_record(source, plan.features.value, prefix)
        return cls(source=source.with_read(plan.read), stages=stages_from_plan(config, plan, prefix),
                   check_tpu=target == "tpu", plan=plan, skipped=skipped, config=config, prefix=prefix,
                   num_classes=num_classes, vocab=vocab)


@dataclasses.dataclass(frozen=True)
class _CountedSteps:
    """A bucketed evaluation's steps, from its batches counted by one pass (the dataset is unchanged:
    each bucket's last group is padded already, and input pipelines bucket the same stream)."""

    batches: "_CountedRows"  # counts batches here: each element is one batch of a bucket

    def steps(self, context: tf.distribute.InputContext) -> int:
        per_pipeline = max(1, context.num_replicas_in_sync // max(1, context.num_input_pipelines))
        return max(1, -(-self.batches(context, count="elements") // per_pipeline))

    def apply(self, dataset: tf.data.Dataset, context: tf.distribute.InputContext) -> tf.data.Dataset:
        return dataset


def _with_example_mask(weights: Union[str, Sequence[str], None]) -> Union[str, list[str]]:
    """A bucketed evaluation's weights: the example mask, times the data's own (per-token) weights."""
    if weights is None:
        return EXAMPLE_MASK
    return [EXAMPLE_MASK, *([weights] if isinstance(weights, str) else weights)]


class _CountedRows:
    """Rows one pass of a packed pipeline delivers to input pipeline `context`, counted by running it
    once (remembered per context): what `PadToSteps` needs to pad every pipeline to the same steps."""

    def __init__(self, pipeline: "Pipeline") -> None:
        self._pipeline = pipeline
        self._counts: dict[tuple[int, int, int], int] = {}

    def __call__(self, context: tf.distribute.InputContext, count: str = "rows") -> int:
        """Rows (the batches' first dimensions added up), or `count='elements'`: batches."""
        key = (context.num_input_pipelines, context.input_pipeline_id, context.num_replicas_in_sync, count)
        if key not in self._counts:
            sizes = self._pipeline.build(context).map(
                lambda *element: tf.shape(tf.nest.flatten(element)[0])[0] if count == "rows" else tf.constant(1))
            self._counts[key] = int(sizes.reduce(tf.constant(0), lambda total, size: total + size))
        return self._counts[key]


def without_bad_records(config: DataConfig, source: RecordFileSource, prefix: str,
                        num_classes: Optional[int], vocab: Optional[Vocabulary] = None
                        ) -> tuple[RecordFileSource, SkipReport]:
    """The source reading only good records (damaged files replaced by checked copies), and what was left out."""
    files_source = source.files_source()
    info = source.info()
    features = config.features or info.features
    report = check_files(config, prefix, files_source.tfrecord_files(), files_source.compression, features,
                         files_source.listed_counts(), num_classes or info.num_classes, vocab)
    clean = TFRecordSource(files=[r.read_from for r in report.files], compression=files_source.compression,
                           read=files_source.read, counts=[r.good for r in report.files], exact_files=True)
    if isinstance(source, DatasetDirSource):
        return dataclasses.replace(source, replaced=clean), report
    return clean, report


def check_copies_reachable(config: DataConfig, report: SkipReport, prefix: str) -> None:
    """With data.service on other machines, the checked copies of damaged files must be where those
    workers can read them: this host's disk is not."""
    if not config.service.enabled or service_host_port(config.service.address)[0] in ("localhost", "127.0.0.1", "[::1]"):
        return
    local = [r for r in report.files if r.read_from != r.path and "://" not in r.read_from]
    if local:
        raise ConfigError(
            f"{prefix}.on_error=skip wrote checked copies of {len(local)} damaged file(s) on this host (e.g. "
            f"{local[0].read_from}), which the tf.data service workers at {config.service.address} cannot read; "
            "set TPU_PIPELINE_CACHE to a shared path (gs://bucket/cache) or rewrite the files "
            "(`tpu-pipeline verify` lists them)"
        )


def check_first_record(source: RecordFileSource, features: Any, prefix: str) -> None:
    """The feature spec against the first record found in the first few files (build time, not a trace later)."""
    for path in source.tfrecord_files()[:3]:
        record = first_record(path, getattr(source, "compression", ""))
        if record is not None:
            check_features(path, record, features, prefix)
            return


def source_from_config(config: DataConfig) -> Source:
    """The source a config names, before the plan gives it its read options."""
    src = config.source
    if isinstance(src, TFRecordSourceConfig):
        if src.dir is not None:
            return DatasetDirSource(dir=src.dir, split=src.split or "train")
        return TFRecordSource(files=src.files, compression=src.compression)
    if isinstance(src, TFDSSourceConfig):
        return TFDSSource.from_config(src)  # decoded feature dicts: no parse follows
    assert isinstance(src, ArraySourceConfig)
    return ArraySource.from_npz(src.path, sharding=src.sharding)


def stages_from_plan(config: DataConfig, plan: Plan, prefix: str = "data") -> list[Any]:
    """The stages after the source, as the plan decided them."""
    pre_ops, pre_random = build_ops(config.preprocess, f"{prefix}.preprocess")
    aug_ops, aug_random = build_ops(config.augment, f"{prefix}.augment")
    features = plan.features.value
    sequence = plan.sequence.value
    records_cached = plan.record_cache.value
    shuffling = plan.shuffle.value
    # Order is set once, for the whole pipeline, by WithOptions below; the stages inherit it.
    on_workers = config.service.enabled
    # "auto" counts this host's cores, which says nothing of a service worker's: tf.data tunes it there.
    parallel = "autotune" if on_workers and config.num_parallel_calls == "auto" else config.num_parallel_calls
    map_args = dict(seed=config.seed, num_parallel_calls=parallel, salted=on_workers)
    # Variable-length features with no data.sequence stay ragged batches (CPU models can take them; the
    # TPU check and train name data.sequence as the fix), rather than failing inside tf.data's batch.
    ragged = sequence is None and any(spec.kind in SEQUENCE_KINDS for spec in (features or {}).values())
    batch = Batch(config.batch_size, config.drop_remainder, ragged=ragged)
    shuffle = Shuffle(config.shuffle.buffer_size, config.seed, config.shuffle.reshuffle_each_iteration)
    if records_cached and shuffling != "off":
        # The record cache replays the first epoch's order; a buffer as large as the data (the
        # elements are references to the cached records, not copies) reshuffles all of it each epoch.
        shuffle = dataclasses.replace(shuffle, buffer_size=FULL_SHUFFLE)
    repeat = Repeat(None if config.repeat == "forever" else config.repeat)
    stages: list[Any] = []
    if plan.batched:
        # Serialized records are shuffled and batched as they are; parsing and every op then run
        # once per batch, vectorized, in one parallel map.
        if shuffling == "window":
            if records_cached:
                stages.append(shuffle)  # the cached blocks, all of them, so each epoch's windows differ
            stages.append(WindowShuffle(
                config.shuffle.buffer_size, config.seed, config.shuffle.reshuffle_each_iteration,
                num_parallel_calls=config.num_parallel_calls,
            ))
        stages += [shuffle] if shuffling == "stream" else []
        records = dataclasses.replace(batch, records=True)
        if sequence is not None and sequence.window:
            # Bucket: the window is the batch of records, parsed as one ragged batch, placed as one
            # window. Pack: blocks of records parsed as one ragged batch, then cut into chunks.
            block = sequence.window if sequence.mode == "bucket" else sequence.parse_block
            records = Batch(block, drop_remainder=False, records=True, per_replica=False)
        stages += [repeat, records]
        seq_ops, seq_random = _sequence_ops(sequence, batched=True)
        stages.append(MapFeatures(
            ops=pre_ops + aug_ops + seq_ops, random_ops=pre_random + aug_random + seq_random,
            parse=make_parser(features, batched=True) if features else None, name="parse_batch", **map_args,
        ))
        stages += _sequence_stages(sequence, batch, config.num_parallel_calls, batched=True, seed=config.seed)
    else:
        parse = make_parser(features) if features else None
        if config.cache.enabled:
            stages.append(MapFeatures(ops=pre_ops, random_ops=pre_random, parse=parse, name="preprocess", **map_args))
            stages.append(Cache.for_config(config, plan, prefix))
            parse, pre_ops, pre_random = None, [], []
        stages += [shuffle] if shuffling == "stream" else []
        stages.append(repeat)
        seq_ops, seq_random = _sequence_ops(sequence, batched=False)
        stages.append(MapFeatures(
            ops=pre_ops + aug_ops + seq_ops, random_ops=pre_random + aug_random + seq_random, parse=parse,
            name="preprocess_augment", **map_args
        ))
        stages += (_sequence_stages(sequence, batch, config.num_parallel_calls, batched=False, seed=config.seed)
                   if sequence else [batch])
    if config.outputs is not None:
        stages.append(ToOutputs(config.outputs.inputs, config.outputs.targets, weights=config.outputs.weights))
    if config.service.enabled:  # plan.service: the workers make the batches, this host prefetches them
        service = config.service
        stages.append(ServiceSplit(service.address, service.mode, service.job_name, service.num_consumers,
                                   service.compression, where=f"{prefix}.service"))
    stages.append(Prefetch(config.prefetch))
    stages.append(WithOptions(make_options(config.options.model_copy(update={"deterministic": plan.order.value}))))
    return stages


def _sequence_ops(sequence: Optional[SequencePlan], batched: bool) -> tuple[list[Any], list[bool]]:
    """data.sequence's pad, or bucket's cut to the length, as one more op of the map that parses (so
    no element crosses threads for it). The cut comes before the bucket's window is formed, so a
    window holds at most window × length tokens however long a document is."""
    if sequence is None or sequence.mode == "pack":
        return [], []
    if sequence.mode == "bucket":
        if sequence.overflow != "truncate":
            return [], []  # error: the bucket stage names the example that does not fit
        return [functools.partial(_cut_to_length, lengths=sequence.lengths, batched=batched)], [False]
    pad = pad_batch if batched else pad_example
    return [lambda features, seed=None: pad(features, sequence.lengths, sequence.overflow)], [False]


def _cut_to_length(features: dict, seed: Any = None, *, lengths: dict, batched: bool) -> dict:
    """Each sequence key's first `length` tokens (of every example of a batch, when `batched`)."""
    cut = {key: features[key][:, :length] if batched else features[key][:length] for key, length in lengths.items()}
    return {**features, **cut}


def _sequence_stages(sequence: Optional[SequencePlan], batch: Batch, num_parallel_calls: Any,
                     batched: bool, seed: int = 0) -> list[Any]:
    """What follows the map for data.sequence: pad → the batch (already made on the batched path);
    bucket → its batches; pack → rows (shuffled in pools of windows), then the batch of rows."""
    if sequence is None:
        return []
    keys = list(sequence.lengths)
    if sequence.mode == "pad":
        return [] if batched else [batch]
    if sequence.mode == "bucket":
        return [Bucket(keys, sequence.window, lengths=sequence.lengths, bucket_lengths=sequence.bucket_lengths,
                       global_batch_size=batch.global_batch_size, overflow=sequence.overflow, scale=sequence.bucket_batch)]
    return [PackRows(keys, sequence.window, lengths=sequence.lengths, algorithm=sequence.algorithm,
                     overflow=sequence.overflow, num_parallel_calls=num_parallel_calls,
                     row_shuffle=sequence.row_shuffle, seed=seed), batch]


def build_dataset(
    config: DataConfig, input_context: Optional[tf.distribute.InputContext] = None, *, target: str = "cpu"
) -> tf.data.Dataset:
    """Shortcut: the dataset for one input pipeline described by `config`."""
    return Pipeline.from_config(config, target=target).build(input_context)
