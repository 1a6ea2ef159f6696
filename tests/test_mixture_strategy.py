"""A mixture through a real `tf.distribute` strategy: 2 input pipelines (hosts) × 8 replicas.

The session's 8-replica MirroredStrategy (8 logical CPUs, conftest) delivers the batches. One process
has one input pipeline, so each host is simulated as `Host`: the same strategy, its dataset function
handed the InputContext a host of a 2-host, 8-replica job gets (`InputContext(2, host, 8)`), as
`Pipeline.distribute` would get it there. What the replicas receive must hold every record of each
source exactly once per source epoch (the two hosts' epochs together), and the example shares must be
the weights' block quotas exactly.

PER_STEP: the one strategy's 8 replicas all read the simulated host's pipeline, so a step here takes 8
of its per-replica batches (64 examples), where a real host's 4 replicas take 4 per step: the
elements and their order are the pipeline's either way, which is what is checked.
"""
from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
import yaml

from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.pipeline.mixtures.schedule import block_quotas
from tpu_pipeline.records.writer import int_feature, write_split

pytestmark = pytest.mark.tf_builds

SOURCES = {"web": 768, "code": 512, "books": 256}  # records per source
WEIGHTS = (0.5, 0.3, 0.2)
OFFSET = 100_000  # source s's record i has id s * OFFSET + i
HOSTS, REPLICAS, GLOBAL_BATCH = 2, 8, 64


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mixture_strategy")
    for index, (name, count) in enumerate(SOURCES.items()):
        records = (tf.train.Example(features=tf.train.Features(feature={"id": int_feature(index * OFFSET + i)}))
                   .SerializeToString() for i in range(count))
        write_split(records, str(root / name), "train", 4)
    return {name: str(root / name / "train-*.tfrecord") for name in SOURCES}


def mixture_config(sources, exhausted: str) -> DataConfig:
    entries = [{"name": name, "weight": weight, "exhausted": exhausted, "source": {"files": sources[name]}}
               for name, weight in zip(SOURCES, WEIGHTS)]
    text = {"mixture": {"sources": entries}, "features": {"id": {"dtype": "int64"}}, "batch_size": GLOBAL_BATCH,
            "shuffle": {"buffer_size": 64}, "seed": 7, "repeat": "forever" if exhausted == "repeat" else 1}
    return DataConfig.model_validate(yaml.safe_load(yaml.safe_dump(text)), context={"prefix": "data"})


class Host:
    """`strategy` as host `index` of `HOSTS` sees it: its dataset function gets that host's InputContext."""

    def __init__(self, strategy: tf.distribute.Strategy, index: int) -> None:
        self.strategy, self.index = strategy, index

    def distribute_datasets_from_function(self, dataset_fn, options=None):
        def on_host(context: tf.distribute.InputContext) -> tf.data.Dataset:
            assert context.num_replicas_in_sync == REPLICAS
            return dataset_fn(tf.distribute.InputContext(HOSTS, self.index, context.num_replicas_in_sync))

        return self.strategy.distribute_datasets_from_function(on_host, options)

    def __getattr__(self, name):
        return getattr(self.strategy, name)


def delivered(pipeline: Pipeline, strategy: tf.distribute.Strategy, host: int, steps: int) -> tuple[list[int], int]:
    """Host `host`'s ids in the order its input pipeline made them (each step's replicas in turn), and the
    steps the strategy delivered (fewer than `steps` when the stream ends)."""
    ids, count = [], 0
    for batch in pipeline.distribute(Host(strategy, host)):
        shards = strategy.experimental_local_results(batch["id"])
        assert len(shards) == REPLICAS and {int(s.shape[0]) for s in shards} == {GLOBAL_BATCH // REPLICAS}
        ids += [int(i) for shard in shards for i in shard.numpy()]
        count += 1
        if count == steps:
            break
    return ids, count


def by_source(ids: list[int]) -> list[list[int]]:
    return [[i % OFFSET for i in ids if i // OFFSET == source] for source in range(len(SOURCES))]


def test_repeating_sources_deliver_each_record_once_per_source_epoch_over_two_hosts_of_eight_replicas(
        sources, eight_replica_strategy):
    pipeline = Pipeline.from_config(mixture_config(sources, "repeat"))
    steps = 4096 // GLOBAL_BATCH  # one whole block of the schedule on each host (see PER_STEP)
    streams = []
    for host in range(HOSTS):
        ids, count = delivered(pipeline, eight_replica_strategy, host, steps)
        assert count == steps and len(ids) == 4096
        # Shares: one block of 4,096 choices holds exactly each source's quota, on every host.
        counts = np.bincount([i // OFFSET for i in ids], minlength=len(SOURCES))
        assert counts.tolist() == block_quotas(WEIGHTS).tolist() == [2048, 1229, 819]
        streams.append(by_source(ids))
    for source, (name, count) in enumerate(SOURCES.items()):
        length = count // HOSTS  # each host reads an equal half of the source per epoch (balanced)
        epochs = min(len(stream[source]) for stream in streams) // length
        assert epochs >= 4, (name, epochs)
        for epoch in range(epochs):
            halves = [stream[source][epoch * length:(epoch + 1) * length] for stream in streams]
            together = collections.Counter(halves[0] + halves[1])
            assert sorted(together) == list(range(count)) and max(together.values()) == 1, (name, epoch)
        first = streams[0][source]
        assert first[:length] != first[length:2 * length], f"{name}: each epoch in a new order"


def test_sources_that_drop_deliver_every_record_once_and_end_on_both_hosts(sources, eight_replica_strategy):
    pipeline = Pipeline.from_config(mixture_config(sources, "drop"))
    per_host = sum(SOURCES.values()) // HOSTS  # 768: 12 whole steps of the one strategy (see PER_STEP)
    everything = []
    for host in range(HOSTS):
        ids, count = delivered(pipeline, eight_replica_strategy, host, 1 << 20)
        assert count == per_host // GLOBAL_BATCH and len(ids) == per_host  # then the stream ends
        everything += ids
    assert len(everything) == len(set(everything))
    assert sorted(everything) == sorted(s * OFFSET + i for s, count in enumerate(SOURCES.values()) for i in range(count))
