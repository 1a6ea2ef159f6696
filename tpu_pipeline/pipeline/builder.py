"""Compose stages into a pipeline, built once per input pipeline (tf.distribute.InputContext).

Stage order from a config (why each sits where it does). Per-example parsing (any op works on
single examples, e.g. image decoding):

  source (list, shuffle, shard, interleave)
  → [with cache]  parse + preprocess → cache          (decode once, reuse every epoch)
  → shuffle                                           (raw records when there is no cache: far
                                                       smaller than decoded images in the buffer)
  → repeat
  → [no cache] parse + preprocess, then augment, in ONE map (one thread crossing per element)
  → batch (per-replica share of the global batch, drop_remainder for static TPU shapes)
  → outputs (inputs, targets) → prefetch → tf.data.Options

Batch-then-parse (every op batchable, no cache; small records): the interleave moves blocks of
records, then window shuffle (one permutation per window of records) → repeat → cut batches of
serialized records → parse_example + every op on the whole batch in one parallel map. tf.data's
cost is per element, so this is ~10x faster for small records than per-example parsing, and the
window shuffle cuts the CPU per record by ~40% again against a per-record shuffle buffer.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence, Union

import tensorflow as tf

from tpu_pipeline.config.data import ArraySourceConfig, DataConfig, TFDSSourceConfig, TFRecordSourceConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops import get_op
from tpu_pipeline.pipeline.dataset_dir import DatasetDirSource, dir_features
from tpu_pipeline.pipeline.options import make_options
from tpu_pipeline.pipeline.parse import make_parser
from tpu_pipeline.pipeline.sources import ArraySource, TFRecordSource, list_files
from tpu_pipeline.pipeline.stages import (
    Batch, Cache, MapFeatures, Prefetch, Repeat, Shuffle, ToOutputs, WindowShuffle, WithOptions,
)
from tpu_pipeline.pipeline.tfds_source import TFDSSource
from tpu_pipeline.pipeline.tpu_check import check_tpu_compatible
from tpu_pipeline.system import available_memory_bytes

Source = Union[TFRecordSource, DatasetDirSource, TFDSSource, ArraySource]


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A source and the stages after it. `build(ctx)` makes the dataset for one input pipeline."""

    source: Source
    stages: Sequence[Any] = ()
    check_tpu: bool = False

    def build(self, input_context: Optional[tf.distribute.InputContext] = None) -> tf.data.Dataset:
        context = input_context or tf.distribute.InputContext()
        dataset = self.source.build(context)
        for stage in self.stages:
            dataset = stage.apply(dataset, context)
        if self.check_tpu:
            check_tpu_compatible(dataset)
        return dataset

    def dataset_fn(self) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
        """For `strategy.distribute_datasets_from_function`."""
        return self.build

    def distribute(self, strategy: tf.distribute.Strategy) -> Any:
        """The per-replica dataset for `strategy` (one `build` per input pipeline)."""
        return strategy.distribute_datasets_from_function(self.build)

    @classmethod
    def from_config(cls, config: DataConfig, *, target: str = "cpu", source: Optional[Source] = None) -> "Pipeline":
        """Builds the stage list a config describes. `target='tpu'` adds the TPU check.

        `source` replaces the config's source, e.g. `ArraySource(arrays)` from Python.
        """
        source = source or source_from_config(config)
        # The stages follow what the source does, not a second look at the files and free memory,
        # which could answer differently (a cached source needs the full shuffle after it).
        stages = stages_from_config(config, records_cached=getattr(source, "cache_records", False))
        return cls(source=source, stages=stages, check_tpu=target == "tpu")


BATCHED_RECORD_BLOCK = 256  # records per interleave element when parsing whole batches
RECORD_CACHE_MAX_BYTES = 1 << 30  # data.cache.records=auto: files of at most this many bytes in all
RECORD_CACHE_MEMORY_SHARE = 8  # ... and at most 1/8 of the memory available when the pipeline is built
RECORD_CACHE_MAX_FILES = 1024  # ... listed in at most this many files (one stat call each, on GCS too)
FULL_SHUFFLE = tf.data.UNKNOWN_CARDINALITY  # a shuffle buffer that holds the whole (finite) input


def parse_mode(config: DataConfig) -> str:
    """'batched', 'per_example' or 'none' (sources that yield parsed features)."""
    if not isinstance(config.source, TFRecordSourceConfig):
        return "none"
    ops = [(where, op, get_op(op.op)) for where, op in _all_ops(config)]
    if config.parse == "batched":
        blocking = [f"{where} ({op.op})" for where, op, registered in ops if not registered.batchable]
        if blocking:
            raise ConfigError(
                f"data.parse=batched needs every op to work on whole batches, but {', '.join(blocking)} "
                "works on single examples; use data.parse=per_example (or auto)"
            )
        return "batched"
    if config.parse == "per_example" or config.cache.enabled:
        return "per_example"
    return "batched" if all(registered.batchable for _, _, registered in ops) else "per_example"


def shuffle_mode(config: DataConfig) -> str:
    """'window', 'stream' or 'off' (see ShuffleConfig.mode)."""
    if not config.shuffle.enabled:
        return "off"
    batched = parse_mode(config) == "batched"
    if config.shuffle.mode == "window" and not batched:
        raise ConfigError(
            "data.shuffle.mode=window permutes serialized records before they are parsed in batches, but this "
            "pipeline parses examples one at a time (or its source yields parsed features); use "
            "data.shuffle.mode=stream (or auto)"
        )
    if config.shuffle.mode == "auto":
        return "window" if batched else "stream"
    return config.shuffle.mode


def in_order(config: DataConfig) -> bool:
    """data.options.deterministic, or when it is unset: in order only when a seed asks for a repeatable run.

    Out of order, a finished element need not wait behind a slow one (a large random crop takes ~3x
    a small one): with one map call per core, waiting idles a core. On W1 (benchmarks/) the
    unordered pipeline used ~6% less CPU per image. Per-element augmentation seeds are assigned
    before the map, so each record's augmentation does not depend on the order either way.
    """
    if config.options.deterministic is not None:
        return config.options.deterministic
    if not isinstance(config.source, TFRecordSourceConfig):
        # TFDS interleaves files itself, by these options: sharding its elements between input
        # pipelines needs that order. (Our TFRecord source orders its own interleave when it must.)
        return True
    return config.seed is not None or config.shuffle.seed is not None


def _all_ops(config: DataConfig) -> list[tuple[str, Any]]:
    return [(f"data.preprocess[{i}]", op) for i, op in enumerate(config.preprocess)] + [
        (f"data.augment[{i}]", op) for i, op in enumerate(config.augment)
    ]


def record_block(config: DataConfig) -> int:
    """Records per interleave element: config value, or 256 for batch-then-parse pipelines."""
    source = config.source
    if not isinstance(source, TFRecordSourceConfig):
        return 0
    if source.record_batch != "auto":
        return source.record_batch
    return BATCHED_RECORD_BLOCK if parse_mode(config) == "batched" else 0


def tfrecord_files(source: TFRecordSourceConfig) -> tuple[list[str], str]:
    """The files a TFRecord source config reads, and their compression."""
    if source.dir is not None:
        directory = DatasetDirSource(dir=source.dir, split=source.split or "train")
        return directory.tfrecord_files(), directory.compression
    return list_files(source.files), source.compression


def files_bytes(files: Sequence[str], limit: int) -> Optional[int]:
    """The files' total size, or None once it passes `limit` (a few stat calls for big datasets)."""
    if len(files) > RECORD_CACHE_MAX_FILES:
        return None
    total = 0
    for path in files:
        total += tf.io.gfile.stat(path).length
        if total > limit:
            return None
    return total


def record_cache_budget() -> int:
    """Bytes of serialized records data.cache.records=auto holds in memory at most."""
    return min(RECORD_CACHE_MAX_BYTES, available_memory_bytes() // RECORD_CACHE_MEMORY_SHARE)


def caches_records(config: DataConfig) -> bool:
    """data.cache.records: whether the source holds its serialized records in memory after epoch 1.

    Reading a ~100 KB record costs ~55 µs of CPU here (copy, CRC, allocation): ~4% of the work per
    JPEG on W1 (benchmarks/README.md), and a part no number of decode threads hides. Once the records are in
    memory, every later epoch skips it. auto caches uncompressed files that fit the budget, for
    pipelines that repeat, when the parsed examples are not cached already and the cache would not
    freeze a per-epoch file order that no record shuffle replaces. The price: each epoch
    starts by filling the full shuffle buffer on one thread (~1 µs an element), cheap next to
    per-example work or for blocks of records, but not for single small records in a
    batch-then-parse pipeline with shuffle.mode=stream, which auto therefore leaves uncached.
    """
    requested, source = config.cache.records, config.source
    if requested is False:
        return False
    if requested is True:
        if not isinstance(source, TFRecordSourceConfig):
            raise ConfigError(
                f"data.cache.records=true holds serialized TFRecord records, but data.source.type is "
                f"{source.type!r}; use data.cache.enabled=true to cache its examples instead"
            )
        if config.cache.enabled:
            raise ConfigError(
                "data.cache.records=true and data.cache.enabled=true both spare the file reads after the first "
                "epoch (the second by caching the parsed examples); keep one: set data.cache.records=false"
            )
        return True
    if not isinstance(source, TFRecordSourceConfig) or config.cache.enabled or config.repeat == 1:
        return False
    if not config.shuffle.enabled and source.shuffle_files:
        return False  # no shuffle after the cache to stand in for the per-epoch file order it would freeze
    if parse_mode(config) == "batched" and shuffle_mode(config) == "stream":
        # The full shuffle after the cache would hold single small records: refilling it each epoch
        # (~1 us a record, on one thread) stalls the parallel parse for longer than reading saves.
        return False
    files, compression = tfrecord_files(source)
    # Compressed files: the records in memory would be larger than the files, by an unknown factor.
    return not compression and files_bytes(files, record_cache_budget()) is not None


def source_from_config(config: DataConfig) -> Source:
    src = config.source
    cache_records = caches_records(config)  # also refuses data.cache.records=true where it cannot apply
    if isinstance(src, TFRecordSourceConfig):
        common = dict(
            shuffle_files=src.shuffle_files, file_seed=src.file_seed, sharding=src.sharding,
            cycle_length=src.cycle_length, block_length=src.block_length,
            num_parallel_calls=src.num_parallel_calls, deterministic=src.deterministic,
            buffer_size=src.buffer_size, record_batch=record_block(config),
            # Batch-then-parse without a per-record shuffle cuts batches straight from the blocks.
            keep_blocks=parse_mode(config) == "batched" and shuffle_mode(config) != "stream",
            cache_records=cache_records,
        )
        if src.dir is not None:
            return DatasetDirSource(dir=src.dir, split=src.split or "train", **common)
        return TFRecordSource(files=src.files, compression=src.compression, **common)
    if isinstance(src, TFDSSourceConfig):
        return TFDSSource.from_config(src, ordered=in_order(config))  # decoded feature dicts: no parse follows
    assert isinstance(src, ArraySourceConfig)
    return ArraySource.from_npz(src.path, sharding=src.sharding)


def _ops(config_ops) -> tuple[list, list[bool]]:
    registered = [get_op(op.op) for op in config_ops]
    return [r.build(op.args) for r, op in zip(registered, config_ops)], [r.random for r in registered]


def _features(config: DataConfig) -> dict[str, Any]:
    """The feature spec: the config's, or a converted dataset's metadata.json when the config has none."""
    source = config.source
    return dict(config.features) or (dir_features(source.dir) if getattr(source, "dir", None) else {})


def stages_from_config(config: DataConfig, records_cached: Optional[bool] = None) -> list[Any]:
    """The stages after the source. `records_cached`: whether the source caches its records
    (None: decide from the config, as source_from_config does)."""
    if records_cached is None:
        records_cached = caches_records(config)
    mode = parse_mode(config)
    shuffling = shuffle_mode(config)  # validates data.shuffle.mode against the parse mode
    features = _features(config) if mode != "none" else {}
    pre_ops, pre_random = _ops(config.preprocess)
    aug_ops, aug_random = _ops(config.augment)
    # Order is set once, for the whole pipeline, by WithOptions below; the stages inherit it.
    map_args = dict(seed=config.seed, num_parallel_calls=config.num_parallel_calls)
    batch = Batch(config.batch_size, config.drop_remainder)
    shuffle = Shuffle(config.shuffle.buffer_size, config.shuffle.seed, config.shuffle.reshuffle_each_iteration)
    if records_cached and shuffling != "off":
        # The record cache replays the first epoch's order; a buffer as large as the data (the
        # elements are references to the cached records, not copies) reshuffles all of it each epoch.
        shuffle = dataclasses.replace(shuffle, buffer_size=FULL_SHUFFLE)
    repeat = Repeat(None if config.repeat == "forever" else config.repeat)
    stages: list[Any] = []
    if mode == "batched":
        # Serialized records are shuffled and batched as they are; parsing and every op then run
        # once per batch, vectorized, in one parallel map.
        if shuffling == "window":
            if records_cached:
                stages.append(shuffle)  # the cached blocks, all of them, so each epoch's windows differ
            stages.append(WindowShuffle(
                config.shuffle.buffer_size, config.shuffle.seed, config.shuffle.reshuffle_each_iteration,
                num_parallel_calls=config.num_parallel_calls,
            ))
        stages += [shuffle] if shuffling == "stream" else []
        stages += [repeat, dataclasses.replace(batch, records=True)]
        stages.append(MapFeatures(
            ops=pre_ops + aug_ops, random_ops=pre_random + aug_random,
            parse=make_parser(features, batched=True) if features else None, name="parse_batch", **map_args,
        ))
    else:
        parse = make_parser(features) if features else None
        if config.cache.enabled:
            stages.append(MapFeatures(ops=pre_ops, random_ops=pre_random, parse=parse, name="preprocess", **map_args))
            stages.append(Cache(config.cache.path))
            parse, pre_ops, pre_random = None, [], []
        stages += [shuffle] if shuffling == "stream" else []
        stages.append(repeat)
        stages.append(MapFeatures(
            ops=pre_ops + aug_ops, random_ops=pre_random + aug_random, parse=parse, name="preprocess_augment", **map_args
        ))
        stages.append(batch)
    if config.outputs is not None:
        stages.append(ToOutputs(config.outputs.inputs, config.outputs.targets))
    stages.append(Prefetch(config.prefetch))
    stages.append(WithOptions(make_options(config.options.model_copy(update={"deterministic": in_order(config)}))))
    return stages


def build_dataset(
    config: DataConfig, input_context: Optional[tf.distribute.InputContext] = None, *, target: str = "cpu"
) -> tf.data.Dataset:
    """Shortcut: the dataset for one input pipeline described by `config`."""
    return Pipeline.from_config(config, target=target).build(input_context)
