"""The stages after the source, in the order a config's plan gives them.

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
  → batch-level augment (mixup, CutMix: ops that mix a batch's examples), with a seed per batch
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
from typing import Any

import tensorflow as tf

from tpu_pipeline.config.data import SEQUENCE_KINDS, DataConfig
from tpu_pipeline.ops import build_ops, split_batch_level
from tpu_pipeline.pipeline.core import seeds
from tpu_pipeline.pipeline.core.mixed_records import with_sources
from tpu_pipeline.pipeline.mixtures.mixture_parse import source_parser
from tpu_pipeline.pipeline.plan import Plan
from tpu_pipeline.pipeline.sequences.modes.registry import sequence_mode
from tpu_pipeline.pipeline.stages.batching import Batch
from tpu_pipeline.pipeline.stages.cache import Cache
from tpu_pipeline.pipeline.stages.map_features import MapFeatures
from tpu_pipeline.pipeline.stages.options import WithOptions, make_options
from tpu_pipeline.pipeline.stages.outputs import ToOutputs
from tpu_pipeline.pipeline.stages.parse import make_parser
from tpu_pipeline.pipeline.stages.prefetch import Prefetch
from tpu_pipeline.pipeline.stages.repeat import Repeat
from tpu_pipeline.pipeline.stages.service_split import ServiceSplit
from tpu_pipeline.pipeline.stages.shuffles import Shuffle, WindowShuffle

FULL_SHUFFLE = tf.data.UNKNOWN_CARDINALITY  # a shuffle buffer that holds the whole (finite) input


def stages_from_plan(config: DataConfig, plan: Plan, prefix: str = "data") -> list[Any]:
    """The stages after the source, as the plan decided them."""
    pre_ops, pre_random = build_ops(config.preprocess, f"{prefix}.preprocess")
    per_example, batch_level = split_batch_level(config.augment)
    aug_ops, aug_random = build_ops(per_example, f"{prefix}.augment")
    features = plan.features.value
    sequence = plan.sequence.value
    mode = sequence_mode(sequence.mode) if sequence is not None else None  # pad, bucket or pack: its ops and stages
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
        block = mode.parse_block(sequence) if mode else 0  # bucket: its window; pack: a block of ~8 MB
        if block:
            records = Batch(block, drop_remainder=False, records=True, per_replica=False)
        stages += [repeat, records]
        seq_ops, seq_random = mode.ops(sequence, batched=True) if mode else ([], [])
        stages.append(MapFeatures(
            ops=pre_ops + aug_ops + seq_ops, random_ops=pre_random + aug_random + seq_random,
            parse=_parser(config, plan, batched=True, prefix=prefix), name="parse_batch", **map_args,
        ))
        stages += mode.stages(sequence, batch, config.num_parallel_calls, batched=True, seed=config.seed) if mode else []
    else:
        parse = _parser(config, plan, batched=False, prefix=prefix)
        if config.cache.enabled:
            stages.append(MapFeatures(ops=pre_ops, random_ops=pre_random, parse=parse, name="preprocess", **map_args))
            stages.append(Cache.for_config(config, plan, prefix))
            parse, pre_ops, pre_random = None, [], []
        stages += [shuffle] if shuffling == "stream" else []
        stages.append(repeat)
        seq_ops, seq_random = mode.ops(sequence, batched=False) if mode else ([], [])
        stages.append(MapFeatures(
            ops=pre_ops + aug_ops + seq_ops, random_ops=pre_random + aug_random + seq_random, parse=parse,
            name="preprocess_augment", **map_args
        ))
        stages += (mode.stages(sequence, batch, config.num_parallel_calls, batched=False, seed=config.seed)
                   if mode else [batch])
    if batch_level:  # mixup, CutMix: on each per-replica batch, with a seed per batch
        mix_ops, mix_random = build_ops(batch_level, f"{prefix}.augment", first=len(per_example))
        stages.append(MapFeatures(ops=mix_ops, random_ops=mix_random, name="augment_batch",
                                  purpose=seeds.AUGMENT_BATCH, **map_args))
    if config.outputs is not None:
        stages.append(ToOutputs(config.outputs.inputs, config.outputs.targets, weights=config.outputs.weights))
    if config.service.enabled:  # plan.service: the workers make the batches, this host prefetches them
        service = config.service
        stages.append(ServiceSplit(service.address, service.mode, service.job_name, service.num_consumers,
                                   service.compression, where=f"{prefix}.service"))
    stages.append(Prefetch(config.prefetch))
    stages.append(WithOptions(make_options(config.options.model_copy(update={"deterministic": plan.order.value}))))
    return stages


def _parser(config: DataConfig, plan: Plan, batched: bool, prefix: str) -> Any:
    """The parse of the records: with the plan's features, or (a mixture whose sources have features or ops
    of their own) each source's records with its own spec and ops, stitched back (mixture_parse). A
    mixture's elements are records with their sources (`mixed_records`): its parse adds them."""
    features = plan.features.value
    if plan.source_features:
        entries = config.mixture.sources
        ops = [build_ops(entry.preprocess, f"{prefix}.mixture.sources[{i}].preprocess")[0] for i, entry in enumerate(entries)]
        return source_parser([entry.name for entry in entries], plan.source_features, ops, batched, prefix)
    parse = make_parser(features, batched=batched) if features else None
    return with_sources(parse) if parse is not None and config.mixture is not None else parse
