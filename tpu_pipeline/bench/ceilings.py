"""The two ceilings a pipeline's throughput is judged against.

(a) compute-bound: the one-thread rate of the per-example work (parse, every op, batch) on records
    already in memory, times the cores the pipeline may use;
(b) read-bound: the rate of reading the files sequentially and batching, with no parse.
A pipeline at its limit reaches the lower of the two; with a cache (records or examples), files
are read in the first epoch only, and (a) alone is the limit after it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Optional

import tensorflow as tf

from tpu_pipeline.bench.measure import Measurement, measure_for, summarize
from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.format import DatasetInfo
from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.pipeline.core.element_keys import RECORDS_KEY, SOURCE_KEY
from tpu_pipeline.pipeline.core.mixed_records import is_mixed, mixed, records_spec
from tpu_pipeline.pipeline.sources.base import Source


def single_thread_options() -> tf.data.Options:
    """Everything on one thread: no autotuning, a private pool of 1, no intra-op parallelism."""
    options = tf.data.Options()
    options.autotune.enabled = False
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    options.experimental_optimization.map_parallelization = False
    return options


def records_in_memory(config: DataConfig, count: int) -> "InMemoryRecords":
    """The first `count` serialized records the config's source yields (epoch 0's file order), with
    the feature spec the config's plan parses them with; a mixture's with each record's source."""
    uncached = config.model_copy(update={"cache": config.cache.model_copy(update={"records": False})})
    pipeline = Pipeline.from_config(uncached)
    dataset = pipeline.source.build(tf.distribute.InputContext())
    if records_spec(dataset.element_spec).shape.rank == 1:  # blocks of records
        dataset = dataset.unbatch()
    elements = list(dataset.take(count).as_numpy_iterator())
    if not is_mixed(dataset.element_spec):
        return InMemoryRecords(elements, pipeline.plan.features.value)
    return InMemoryRecords([element[RECORDS_KEY] for element in elements], pipeline.plan.features.value,
                           sources=[int(element[SOURCE_KEY]) for element in elements])


def in_memory_config(config: DataConfig) -> DataConfig:
    """The same per-example work, sequential: no shuffle, no cache, parallelism 1, repeat forever."""
    return config.model_copy(update={
        "shuffle": config.shuffle.model_copy(update={"enabled": False}),
        "cache": config.cache.model_copy(update={"enabled": False, "records": False}),
        "repeat": "forever", "num_parallel_calls": 1, "prefetch": 0,
        "options": config.options.model_copy(update={  # the same as single_thread_options()
            "autotune": False, "private_threadpool_size": 1, "max_intra_op_parallelism": 1, "map_parallelization": False,
        }),
    })


def steady_state_work(config: DataConfig, records: "InMemoryRecords") -> tuple[DataConfig, Source]:
    """What each example costs once the pipeline runs: with the cache on, only the work after it.

    A cached pipeline parses and preprocesses each record once; every later epoch reads elements
    from the cache and runs only the augment ops and the batch. So its ceiling is that work, on
    elements already preprocessed (held in memory like the cache holds them).
    """
    work = in_memory_config(config)
    if not config.cache.enabled:
        return work, records
    prepared = work.model_copy(update={"augment": [], "outputs": None, "repeat": 1, "drop_remainder": False,
                                       "batch_size": len(records.records)})
    elements = Pipeline.from_config(prepared, source=records).build().get_single_element()
    # Elements are parsed already: a source of finished feature dicts, so the plan parses nothing.
    return work.model_copy(update={"preprocess": []}), InMemoryElements(elements)


def one_thread_work(config: DataConfig, records: "InMemoryRecords") -> tf.data.Dataset:
    """The steady-state per-example work of `config` on in-memory data, all on one thread."""
    work, source = steady_state_work(config, records)
    # in_memory_config made every map sequential; Batch and ToOutputs are sequential by default.
    return Pipeline.from_config(work, source=source).build().with_options(single_thread_options())


@dataclasses.dataclass(frozen=True)
class InMemoryRecords(Source):
    """Serialized records held in memory (the ceilings' and the doctor's input), with their feature spec;
    a mixture's with each record's source (`sources`), yielded as mixed elements as the mixture yields them."""

    yields_records: ClassVar[bool] = True

    records: list
    features: dict = dataclasses.field(default_factory=dict)
    sources: Optional[list] = None

    def info(self) -> DatasetInfo:
        return DatasetInfo(len(self.records), None, dict(self.features))

    def build(self, context: tf.distribute.InputContext, epoch: Optional[tf.Tensor] = None) -> tf.data.Dataset:
        records = tf.constant(self.records, tf.string)
        if self.sources is None:
            return tf.data.Dataset.from_tensor_slices(records)
        return tf.data.Dataset.from_tensor_slices(mixed(records, tf.constant(self.sources, tf.int32)))


@dataclasses.dataclass(frozen=True)
class InMemoryElements(Source):
    """Finished elements held in memory: feature dicts, or records taken as opaque strings (not parsed)."""

    elements: Any

    def build(self, context: tf.distribute.InputContext, epoch: Optional[tf.Tensor] = None) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices(self.elements)


def sequential_read(config: DataConfig, pipeline: Optional[Pipeline] = None) -> tf.data.Dataset:
    """Files read one after the other and batched (global batch), no parse: what storage allows.

    `pipeline`: the config's pipeline when the caller has it already (its plan listed the files)."""
    pipeline = pipeline or Pipeline.from_config(config)
    files = list(pipeline.plan.files.value)
    if not files:
        raise ValueError("the read ceiling needs a source that reads TFRecord files")
    buffer = pipeline.source.read.buffer_bytes(files[0])
    dataset = tf.data.TFRecordDataset(files, compression_type=pipeline.source.compression, buffer_size=buffer)
    return dataset.repeat().batch(config.batch_size, drop_remainder=True).with_options(single_thread_options())


@dataclasses.dataclass(frozen=True)
class Ceilings:
    one_thread: Measurement
    cores: int
    read: Optional[Measurement]
    reads_files_every_epoch: bool = True  # False with a cache: (b) then limits only the first epoch

    @property
    def compute_bound(self) -> float:
        return self.one_thread.examples_per_sec * self.cores

    @property
    def read_bound(self) -> Optional[float]:
        return self.read.examples_per_sec if self.read else None

    @property
    def limit(self) -> float:
        read = self.read_bound if self.reads_files_every_epoch else None
        return min(x for x in (self.compute_bound, read) if x is not None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "compute_bound_examples_per_sec": self.compute_bound,
            "one_thread_examples_per_sec": self.one_thread.examples_per_sec,
            "read_bound_examples_per_sec": self.read_bound,
            "reads_files_every_epoch": self.reads_files_every_epoch,
            "limit_examples_per_sec": self.limit,
        }


def measure_ceilings(
    config: DataConfig, cores: int, records: int = 512, seconds: float = 0.7, warmup: int = 2, repeats: int = 3
) -> Ceilings:
    """Both ceilings for `config` on this machine (medians of `repeats`)."""
    memory = records_in_memory(config, records)
    one = summarize(measure_for(one_thread_work(config, memory), seconds, warmup, repeats))
    planned = Pipeline.from_config(config)  # one plan (file listing and sizes) for both uses below
    read = summarize(measure_for(sequential_read(config, planned), seconds, warmup, repeats))
    cached = config.cache.enabled or planned.plan.record_cache.value
    return Ceilings(one_thread=one, cores=cores, read=read, reads_files_every_epoch=not cached)
