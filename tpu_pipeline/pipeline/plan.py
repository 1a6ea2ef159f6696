"""The plan: every decision a pipeline makes from its config and its source, made once, with its reason.

Parse mode, shuffle mode, record block, record cache, element order, feature spec and files are
decided here and nowhere else; the builder, `bench`, `doctor` and the tests read the plan.
`Plan.explain()` prints the decisions and why (`tpu-pipeline demo --explain`, `doctor`).

Whether records need parsing is a property of the source (`Source.yields_records`), never of a
config rewritten to pretend: the doctor measures raw batching with a source of opaque elements.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import tensorflow as tf

from tpu_pipeline.config.data import DataConfig, FeatureConfig, TFDSSourceConfig, TFRecordSourceConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops import check_ops, get_op
from tpu_pipeline.pipeline.core.element_keys import SOURCE_KEY
from tpu_pipeline.pipeline.mixtures.mixture_source import MixtureSource
from tpu_pipeline.pipeline.sequences.modes.registry import plan_sequence
from tpu_pipeline.pipeline.sources.base import ReadOptions, Source
from tpu_pipeline.system import available_memory_bytes

BATCHED_RECORD_BLOCK = 256  # records per interleave element when parsing whole batches
RECORD_CACHE_MAX_BYTES = 1 << 30  # data.cache.records=auto: files of at most this many bytes in all
RECORD_CACHE_MEMORY_SHARE = 8  # ... and at most 1/8 of the memory available when the pipeline is planned
RECORD_CACHE_MAX_FILES = 1024  # ... listed in at most this many files (one stat call each, on GCS too)
DOCTOR_MEMORY_SHARE = 4  # sizes are measured up to 1/4 of available memory (the doctor's proposal)


@dataclasses.dataclass(frozen=True)
class Decision:
    value: Any
    reason: str


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the pipeline does, decided once. Each field's `reason` says why."""

    parse: Decision  # 'batched' | 'per_example' | 'none' (the source yields parsed features)
    shuffle: Decision  # 'window' | 'stream' | 'off'
    record_block: Decision  # records per interleave element (0: single records)
    record_cache: Decision  # bool: serialized records held in memory after epoch 1
    order: Decision  # bool: the parallel stages keep the element order
    features: Decision  # dict[str, FeatureConfig]: the parse spec ({} when nothing is parsed)
    files: Decision  # tuple[str, ...]: the TFRecord files read (() when none)
    read: ReadOptions  # the source's read options, from the decisions above
    data_bytes: Optional[int] = None  # the files' size, where measured (None: not needed, or too large)
    ops_batchable: bool = False  # every op works on whole batches (batch-then-parse is possible)
    service: Decision = Decision("off", "data.service.address unset: every stage runs on this host")
    sequence: Decision = Decision(None, "no data.sequence: every feature has a static shape")
    # A mixture whose sources have features or preprocess ops of their own: each source's parse spec (its
    # records are parsed, and its ops run, apart before they are stitched back; mixture_parse). () otherwise.
    source_features: tuple[dict[str, FeatureConfig], ...] = ()

    DECISIONS = ("parse", "shuffle", "record_block", "record_cache", "order", "features", "files", "service", "sequence")

    @property
    def batched(self) -> bool:
        return self.parse.value == "batched"

    def explain(self) -> str:
        """One line per decision: `name  value  (reason)`."""
        shown = {name: _show(name, getattr(self, name).value) for name in self.DECISIONS}
        width = max(22, *(len(value) for value in shown.values()))  # one column, however long a value
        return "\n".join(f"  {name:13s} {shown[name]:{width}s} {getattr(self, name).reason}" for name in self.DECISIONS)

    def as_dict(self) -> dict[str, Any]:
        return {name: {"value": _plain(name, getattr(self, name).value), "reason": getattr(self, name).reason}
                for name in self.DECISIONS}


def _show(name: str, value: Any) -> str:
    if name == "sequence":
        return "off" if value is None else str(value)
    if name == "features":
        return ", ".join(value) if value else "-"
    if name == "files":
        return f"{len(value)} file(s)"
    if name == "order":
        return "in order" if value else "out of order"
    return str(value)


def _plain(name: str, value: Any) -> Any:
    if name == "sequence":
        return None if value is None else dataclasses.asdict(value)
    if name == "features":
        return {key: spec.model_dump() for key, spec in value.items()}
    if name == "files":
        return list(value)
    return value


def make_plan(config: DataConfig, source: Source, prefix: str = "data") -> Plan:
    """Decides everything for `config` read from `source` (`prefix`: the config key, for errors)."""
    check_ops(config, prefix)
    files = tuple(source.tfrecord_files()) if source.yields_records else ()
    ops = _ops(config, prefix)
    parse = _parse(config, source, ops, prefix)
    shuffle = _shuffle(config, parse.value, prefix)
    block = _record_block(config, parse.value, files)
    data_bytes = _data_bytes(config, source, files)
    cache = _record_cache(config, source, files, parse.value, shuffle.value, data_bytes, prefix)
    order = _order(config, source, files, prefix)
    features = _features(config, source, parse.value, prefix)
    keep_blocks = parse.value == "batched" and shuffle.value != "stream"  # batches are cut straight from blocks
    read = _read_options(config, block.value, keep_blocks, cache.value, order.value)
    origin = f"from {config.source.dir}/metadata.json" if getattr(config.source, "dir", None) else "listed from the source"
    return Plan(
        parse=parse, shuffle=shuffle, record_block=block, record_cache=cache, order=order, features=features,
        files=Decision(files, f"{origin}" if files else "the source reads no TFRecord file"), read=read,
        data_bytes=data_bytes, ops_batchable=all(registered.batchable for _, _, registered in ops),
        service=_service(config, source, prefix),
        sequence=Decision(*plan_sequence(config, prefix, source, files, _files_bytes)),
        source_features=_per_source_features(config, source) if parse.value != "none" else (),
    )


def _service(config: DataConfig, source: Source, prefix: str) -> Decision:
    """data.service: which stages run on tf.data service workers. Everything up to the batches
    (and the split into inputs and targets) does: that is the CPU work, and a batch crosses the
    network as one message. Prefetching to the device stays on the trainer host."""
    service = config.service
    key = f"{prefix}.service"
    if not service.enabled:
        return Decision("off", f"{key}.address unset: every stage runs on this host")
    if prefix != "data":
        raise ConfigError(
            f"{key}: exact evaluation reads every record once in a fixed number of steps, which the service's "
            f"dynamic split between workers cannot promise; remove {key} (evaluation runs on the trainer hosts)"
        )
    if source.in_memory:
        raise ConfigError(
            f"{key}: the source ({type(source).__name__}) holds its data in this process's memory, which service "
            "workers cannot read; write it to TFRecord files first (tpu-pipeline convert)"
        )
    if config.cache.enabled and config.cache.path:
        raise ConfigError(
            f"{prefix}.cache.path with {key}: every worker would write the same cache files; unset "
            f"{prefix}.cache.path (each worker then caches in its own memory)"
        )
    exactly = ("each example reaches one trainer once per epoch (at most once: a killed worker's unfinished "
               "split is lost)" if service.mode == "distributed_epoch" else
               "every worker reads all the data, with its own order and augmentation")
    return Decision(f"workers: read..batch, {service.mode}",
                    f"{key}.address={service.address}: the workers run every stage up to the batches; this host "
                    f"prefetches them to the device. {service.mode}: {exactly}")


def _ops(config: DataConfig, prefix: str) -> list[tuple[str, str, Any]]:
    """(config key, op name, registry entry) of every preprocess and augment op (a mixture's per source too)."""
    sections = [("preprocess", config.preprocess), ("augment", config.augment)]
    sections += [(f"mixture.sources[{i}].preprocess", entry.preprocess)
                 for i, entry in enumerate(config.mixture.sources if config.mixture is not None else [])]
    return [(f"{prefix}.{section}[{i}]", op.op, get_op(op.op, f"{prefix}.{section}[{i}]"))
            for section, ops in sections for i, op in enumerate(ops)]


def _parse(config: DataConfig, source: Source, ops: list[tuple[str, str, Any]], prefix: str) -> Decision:
    if not source.yields_records:
        return Decision("none", f"the source ({type(source).__name__}) yields parsed features")
    single = [f"{where} ({name})" for where, name, registered in ops if not registered.batchable]
    if config.parse == "batched":
        if single:
            raise ConfigError(
                f"{prefix}.parse=batched needs every op to work on whole batches, but {', '.join(single)} "
                f"works on single examples; use {prefix}.parse=per_example (or auto)"
            )
        if config.cache.enabled:
            raise ConfigError(
                f"{prefix}.parse=batched parses whole batches after the shuffle, so there are no parsed examples for "
                f"{prefix}.cache.enabled to cache; use {prefix}.cache.records (the serialized records in memory) or "
                f"{prefix}.parse=per_example"
            )
        return Decision("batched", f"{prefix}.parse=batched")
    if config.parse == "per_example":
        return Decision("per_example", f"{prefix}.parse=per_example")
    if config.cache.enabled:
        return Decision("per_example", f"{prefix}.cache.enabled: examples are parsed one by one into the cache")
    if single:
        return Decision("per_example", f"auto: {single[0]} works on single examples")
    return Decision("batched", "auto: every op works on whole batches, so records are batched, then each batch "
                               "is parsed with one call (tf.data's cost is per element)")


def _shuffle(config: DataConfig, parse: str, prefix: str) -> Decision:
    if not config.shuffle.enabled:
        return Decision("off", f"{prefix}.shuffle.enabled=false")
    if config.mixture is not None:
        return Decision("off", f"{prefix}.mixture: each source shuffles its own records (windows of "
                               f"{config.shuffle.buffer_size} each) before the mixing, so a resume positions each alone")
    batched = parse == "batched"
    mode = config.shuffle.mode
    if mode == "window" and not batched:
        raise ConfigError(
            f"{prefix}.shuffle.mode=window permutes serialized records before they are parsed in batches, but this "
            "pipeline parses examples one at a time (or its source yields parsed features); use "
            f"{prefix}.shuffle.mode=stream (or auto)"
        )
    if mode != "auto":
        return Decision(mode, f"{prefix}.shuffle.mode={mode}")
    if batched:
        return Decision("window", "auto: records are parsed in batches, so windows of "
                                  f"{config.shuffle.buffer_size} records are permuted with one gather each")
    return Decision("stream", f"auto: examples one at a time: tf.data's shuffle buffer of {config.shuffle.buffer_size}")


def _record_block(config: DataConfig, parse: str, files: tuple[str, ...]) -> Decision:
    if not files:
        return Decision(0, "the source reads no files")
    requested = config.source.record_batch if isinstance(config.source, TFRecordSourceConfig) else "auto"
    if requested != "auto":
        return Decision(requested, f"data.source.record_batch={requested}")
    if parse == "batched":
        return Decision(BATCHED_RECORD_BLOCK, f"auto: batch-then-parse moves blocks of {BATCHED_RECORD_BLOCK} "
                                              "records through the parallel interleave")
    return Decision(0, "auto: examples are parsed one at a time, so records move singly")


def record_cache_budget() -> int:
    """Bytes of serialized records data.cache.records=auto holds in memory at most."""
    return min(RECORD_CACHE_MAX_BYTES, available_memory_bytes() // RECORD_CACHE_MEMORY_SHARE)


def _files_bytes(files: tuple[str, ...], limit: int) -> Optional[int]:
    """The files' total size, or None once it passes `limit` (a few stat calls for big datasets)."""
    if len(files) > RECORD_CACHE_MAX_FILES:
        return None
    total = 0
    for path in files:
        total += tf.io.gfile.stat(path).length
        if total > limit:
            return None
    return total


def _data_bytes(config: DataConfig, source: Source, files: tuple[str, ...]) -> Optional[int]:
    """The files' size up to 1/4 of available memory, measured only when a record cache could apply."""
    if not files or config.cache.enabled or config.repeat == 1 or _compressed(source):
        return None
    return _files_bytes(files, max(record_cache_budget(), available_memory_bytes() // DOCTOR_MEMORY_SHARE))


def _record_cache(config: DataConfig, source: Source, files: tuple[str, ...], parse: str, shuffle: str,
                  data_bytes: Optional[int], prefix: str) -> Decision:
    """data.cache.records: whether the source holds its serialized records in memory after epoch 1.

    Reading a ~100 KB record costs ~55 µs of CPU here (copy, CRC, allocation): ~4% of the work per
    JPEG on W1 (benchmarks/README.md), and a part no number of decode threads hides. Once the
    records are in memory, every later epoch skips it. The price: each epoch starts by filling a
    full shuffle buffer on one thread (~1 µs an element), cheap next to per-example work or for
    blocks of records, but not for single small records with a stream shuffle.
    """
    requested = config.cache.records
    key = f"{prefix}.cache.records"
    if requested is False:
        return Decision(False, f"{key}=false")
    if requested is True:
        if not files:
            raise ConfigError(
                f"{key}=true holds serialized TFRecord records, but this source ({type(source).__name__}) reads no "
                f"TFRecord files; use {prefix}.cache.enabled=true to cache its examples instead"
            )
        if config.cache.enabled:
            raise ConfigError(
                f"{key}=true and {prefix}.cache.enabled=true both spare the file reads after the first epoch (the "
                f"second by caching the parsed examples); keep one: set {key}=false"
            )
        return Decision(True, f"{key}=true")
    if not files:
        return Decision(False, "auto: the source reads no TFRecord files")
    if config.mixture is not None:
        return _mixture_record_cache(config, source, data_bytes)
    if config.cache.enabled:
        return Decision(False, f"auto: {prefix}.cache.enabled caches the parsed examples already")
    if config.repeat == 1:
        return Decision(False, "auto: one pass, nothing to reuse")
    if not config.shuffle.enabled and getattr(config.source, "shuffle_files", True):
        return Decision(False, "auto: the cache would freeze the per-epoch file order, and no record shuffle "
                               "replaces it")
    if parse == "batched" and shuffle == "stream":
        return Decision(False, "auto: a full shuffle of single small records after the cache (~1 us a record, "
                               "on one thread, each epoch) costs more than reading them")
    if source.compression:
        return Decision(False, "auto: compressed files (the records in memory would be larger, by an unknown factor)")
    budget = record_cache_budget()
    over = _over_budget(data_bytes, budget, "the files")
    if over is not None:
        return over
    return Decision(True, f"auto: {data_bytes / 2**20:,.1f} MiB of files fit the budget of {budget / 2**20:,.0f} MiB; "
                          "later epochs read no file and shuffle all records")


def _over_budget(data_bytes: Optional[int], budget: int, what: str, then: str = "") -> Optional[Decision]:
    """record_cache auto's refusal when `what` (files of `data_bytes`, None: not measured) exceed the budget."""
    if data_bytes is None or data_bytes > budget:
        return Decision(False, f"auto: {what} exceed the budget of {budget / 2**20:,.0f} MiB "
                               f"(min(1 GiB, 1/8 of available memory)){then}")
    return None


def _compressed(source: Source) -> bool:
    """Whether a file read is compressed (a mixture: any of its sources')."""
    parts = source.record_sources() if isinstance(source, MixtureSource) else (source,)
    return any(part.compression for part in parts)


def _mixture_record_cache(config: DataConfig, source: Source, data_bytes: Optional[int]) -> Decision:
    """record_cache auto for a mixture: the single source's budget, for all its sources' files together. Each
    source then reads every epoch from its records in memory, the same stream as from its files (no reshuffle
    after the cache: a mixture's resume needs that stream)."""
    if not any(entry.exhausted == "repeat" for entry in config.mixture.sources):
        return Decision(False, "auto: every source of the mixture is read once (exhausted: drop or stop), "
                               "nothing to reuse")
    if _compressed(source):
        return Decision(False, "auto: compressed files (the records in memory would be larger, by an unknown factor)")
    budget = record_cache_budget()
    over = _over_budget(data_bytes, budget, "the mixture's files", "; every epoch reads them again")
    if over is not None:
        return over
    return Decision(True, f"auto: the mixture's {data_bytes / 2**20:,.1f} MiB of files fit the budget of "
                          f"{budget / 2**20:,.0f} MiB; each source reads its later epochs from memory (the same "
                          "records in the same order)")


def _order(config: DataConfig, source: Source, files: tuple[str, ...], prefix: str) -> Decision:
    """data.options.deterministic; unset: in order.

    In order, each epoch's element sequence is a pure function of (data.seed, epoch, input
    pipeline), so a resumed run continues exactly where it stopped (Pipeline.build(start=...)).
    Out of order, a finished element need not wait behind a slow one (a large random crop takes
    ~3x a small one), but which elements form a batch depends on thread timing. Measured side by
    side (benchmarks/README.md, issue 11): in order costs ~2% on W1 (JPEG decode at the host's
    limit) and nothing measurable on W2.
    """
    requested = config.options.deterministic
    if requested is None and config.service.enabled:
        return Decision(False, f"auto: with {prefix}.service the order already depends on which worker answers "
                               "first, so in-order stages would cost ~2% on the workers for nothing")
    if requested is not None:
        why = "" if requested else " (a resumed run then continues from its step, but not with exactly the same examples)"
        return Decision(requested, f"{prefix}.options.deterministic={str(requested).lower()}{why}")
    return Decision(True, "auto: in order, so a resumed run continues with exactly the examples not yet delivered "
                          f"(set {prefix}.options.deterministic=false for ~2% more JPEG throughput, without that)")


def _features(config: DataConfig, source: Source, parse: str, prefix: str) -> Decision:
    if parse == "none":
        return Decision({}, "nothing to parse")
    if config.mixture is not None:
        return _mixture_features(config, source, prefix)
    if config.features:
        return Decision(dict(config.features), f"{prefix}.features")
    known = source.info().features
    if not known:
        raise ConfigError(
            f"{prefix}.features: the source yields serialized tf.Example records and has no feature spec of its own; "
            "give one, e.g. {image: {dtype: string}, label: {dtype: int64}}"
        )
    specs = {name: spec if isinstance(spec, FeatureConfig) else FeatureConfig(**spec) for name, spec in known.items()}
    return Decision(specs, "the dataset's metadata.json")


def _read_options(config: DataConfig, record_block: int, keep_blocks: bool, cache_records: bool, order: bool) -> ReadOptions:
    """The source's read knobs, passed whole: the config's, with what the plan decided."""
    src = config.source
    knobs: dict[str, Any] = {}
    if isinstance(src, TFRecordSourceConfig):
        knobs = dict(
            shuffle_files=src.shuffle_files, sharding=src.sharding, cycle_length=src.cycle_length,
            block_length=src.block_length, num_parallel_calls=src.num_parallel_calls,
            deterministic=src.deterministic, buffer_size=src.buffer_size,
        )
    elif isinstance(src, TFDSSourceConfig):
        knobs = dict(
            shuffle_files=src.shuffle_files, sharding=src.sharding, cycle_length=src.interleave_cycle_length,
            block_length=src.interleave_block_length, deterministic=order,
        )
    return ReadOptions(seed=config.seed, record_block=record_block, keep_blocks=keep_blocks,
                       cache_records=cache_records, **knobs)


def _per_source_features(config: DataConfig, source: Source) -> tuple[dict[str, FeatureConfig], ...]:
    """Each source's own parse spec, where some source of the mixture has features or preprocess ops of its
    own (else ()): its `features` if it gives them (its records differ), else data.features, else its
    metadata.json's."""
    if config.mixture is None or not any(entry.features or entry.preprocess for entry in config.mixture.sources):
        return ()
    specs = []
    for entry, part in zip(config.mixture.sources, source.record_sources()):
        known = {name: spec if isinstance(spec, FeatureConfig) else FeatureConfig(**spec)
                 for name, spec in (part.info().features or {}).items()}
        specs.append(dict(entry.features or config.features or known))
    return tuple(specs)


def _mixture_features(config: DataConfig, source: Source, prefix: str) -> Decision:
    """One parse spec for the mixed records: data.features (or the first source's metadata.json), each
    source's own features added. Each record's source (`SOURCE_KEY`, its index in data.mixture.sources)
    comes beside the records and is added after the parse (`mixed_records.with_sources`), not parsed."""
    specs: dict[str, FeatureConfig] = dict(config.features)
    origin = f"{prefix}.features" if specs else "the first source's metadata.json"
    if not specs:
        known = source.info().features or {}
        specs = {name: spec if isinstance(spec, FeatureConfig) else FeatureConfig(**spec) for name, spec in known.items()}
    for index, entry in enumerate(config.mixture.sources):
        for name, spec in entry.features.items():
            if name in specs and specs[name] != spec:
                raise ConfigError(
                    f"{prefix}.mixture.sources[{index}] ({entry.name}).features.{name}: {spec.model_dump()} differs from "
                    f"{specs[name].model_dump()} given before; one name has one spec in a mixture (rename it in the "
                    "source's records, or give it the same spec)")
            specs[name] = spec
    return Decision(specs, f"{origin} and each source's own; {SOURCE_KEY} (each example's source, int32) is added "
                           "after the parse")
