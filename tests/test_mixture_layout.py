"""A mixture's block layout against a plain replay, record for record and byte for byte.

`MixtureSource._segment` lays out each block of 4096 positions with vector ops (each source's quota
in one vector, one copy of each record to its place; with the record cache, each source's indices
laid out and one gather from the cached records). The replay here walks the schedule one position at
a time instead: position p takes the next record of the source `block_choices` names (a `drop` source
past its end is passed over, a `stop` source's first choice past its end ends the mixture), and
compares bytes and sources. The records of each source are its own stream read from its files
(`_stream`), so what is checked is the layout alone: the order of the records, each one's source, and
that every record is the source's record unchanged, from the files or from the cache.
"""
from __future__ import annotations

import itertools

import pytest
import tensorflow as tf

from tpu_pipeline.pipeline.core.element_keys import RECORDS_KEY, SOURCE_KEY
from tpu_pipeline.pipeline.mixtures.mixture_source import MixturePart, MixtureSource
from tpu_pipeline.pipeline.sources.base import ReadOptions
from tpu_pipeline.pipeline.sources.tfrecord import TFRecordSource
from tpu_pipeline.testing.data import write_tfrecords

pytestmark = pytest.mark.tf_builds

LIMIT = 4096 + 300  # past the first block, so a block boundary is crossed


@pytest.fixture(scope="module")
def four_sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("layout")
    return {name: write_tfrecords(root / name, {"x": {"dtype": "int64"}}, count, num_shards=2)
            for name, count in (("web", 50), ("code", 30), ("books", 20), ("tiny", 7))}


def mixture(files, exhausted, weights, cached=False):
    parts = tuple(MixturePart(name, TFRecordSource(files=path), weight, policy)
                  for (name, path), weight, policy in zip(files.items(), weights, exhausted))
    source = MixtureSource(parts, tuple(float(w) for w in weights), seed=3, shuffle_buffer=16)
    return source.with_read(ReadOptions(seed=3, cache_records=cached))


def replay(source: MixtureSource, context: tf.distribute.InputContext, limit: int) -> list[tuple[int, bytes]]:
    """The mixed stream position by position from the schedule and each source's own records."""
    positions = source.positions(context)
    schedule, totals = positions.schedule, positions.totals
    streams = [iter(source._stream(index, part, context, 0, totals[index]).unbatch().as_numpy_iterator())
               if schedule.quotas[index] else iter(()) for index, part in enumerate(source.parts)]
    ended = [False] * len(streams)
    out: list[bytes] = []
    for block in itertools.count():
        for choice in schedule.block_choices(block):
            record = None if ended[choice] else next(streams[choice], None)
            if record is None:
                ended[choice] = True
                if source.parts[choice].exhausted == "stop":
                    return out
                if all(ended[i] for i in range(len(streams)) if schedule.quotas[i]):
                    return out
                continue
            out.append((int(choice), bytes(record)))
            if len(out) == limit:
                return out
    return out


def mixed(source: MixtureSource, context: tf.distribute.InputContext, start: int,
          limit: int) -> list[tuple[int, bytes]]:
    return [(int(element[SOURCE_KEY]), bytes(element[RECORDS_KEY]))
            for element in source.build_from(context, start).take(limit).as_numpy_iterator()]


@pytest.mark.parametrize("exhausted, weights, cached", [
    (("repeat",) * 4, (5, 3, 2, 1), True),
    (("repeat",) * 4, (5, 3, 2, 1), False),
    (("repeat", "drop", "stop", "repeat"), (1, 1, 1, 1), True),
    (("repeat", "drop", "stop", "repeat"), (1, 1, 1, 1), False),
    (("drop",) * 4, (1, 0, 2, 1), True),
    (("drop", "repeat", "repeat", "stop"), (2, 1, 0, 1), False),
])
def test_the_mixed_stream_is_the_replay_of_its_schedule(four_sources, exhausted, weights, cached):
    source = mixture(four_sources, exhausted, weights, cached)
    for pipelines in (1, 2) if "stop" in exhausted else (1,):  # 2: the last pipeline's share of each source
        context = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pipelines - 1)
        expected = replay(source, context, LIMIT)
        assert mixed(source, context, 0, LIMIT) == expected
        for start in (100, 4095):  # resumed within the first block, at its last position
            if start <= len(expected):
                assert mixed(source, context, start, LIMIT - start) == expected[start:], (pipelines, start)
