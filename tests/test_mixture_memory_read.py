"""A mixture's record cache: each source read from its records in memory gives its file stream, byte for byte.

With the plan's record_cache on, `MixtureSource._record_cache` reads every record of every source's files
once into one vector, each source's epochs are read as indices into it (`TFRecordSource.build(...,
records=...)`: same per-epoch file order, same balanced share, same blocks, same window shuffle), and each
block of the mixture is one gather. The streams must be identical, records and sources, so a resume on a
machine that decides the cache differently still continues exactly.
"""
from __future__ import annotations

import dataclasses
import glob
import os

import pytest
import tensorflow as tf
import yaml

from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.pipeline.core.element_keys import RECORDS_KEY, SOURCE_KEY
from tpu_pipeline.pipeline.mixtures.mixture_source import MixturePart, MixtureSource
from tpu_pipeline.pipeline.plan import make_plan
from tpu_pipeline.pipeline.source_factory import mixture_from_config
from tpu_pipeline.pipeline.sources.base import ReadOptions
from tpu_pipeline.pipeline.sources.tfrecord import TFRecordSource
from tpu_pipeline.testing.data import write_tfrecords

pytestmark = pytest.mark.tf_builds

LIMIT = 3000  # several epochs of every source


@pytest.fixture(scope="module")
def three_sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("memory_read")
    return {name: write_tfrecords(root / name, {"x": {"dtype": "int64"}}, count, num_shards=3)
            for name, count in (("a", 250), ("b", 150), ("c", 100))}


def gzip_copy(pattern: str, directory) -> str:
    """The files of `pattern` written again, GZIP-compressed; their glob."""
    os.makedirs(directory, exist_ok=True)
    for path in sorted(glob.glob(pattern)):
        with tf.io.TFRecordWriter(os.path.join(directory, os.path.basename(path)), options="GZIP") as writer:
            for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
                writer.write(record)
    return os.path.join(directory, "*")


def mixture(sources, exhausted, cache, compression=None, weights=(0.5, 0.3, 0.2), cycle_length=16):
    compression = compression or ("",) * len(sources)
    parts = tuple(MixturePart(name, TFRecordSource(files=path, compression=kind), weight, policy)
                  for (name, path), weight, policy, kind in zip(sources.items(), weights, exhausted, compression))
    source = MixtureSource(parts, weights, seed=5, shuffle_buffer=32)
    return source.with_read(ReadOptions(seed=5, record_block=16, cache_records=cache, cycle_length=cycle_length))


def element(mixed: dict) -> tuple[int, bytes]:
    return int(mixed[SOURCE_KEY]), bytes(mixed[RECORDS_KEY])


def records(source: MixtureSource, context: tf.distribute.InputContext, start: int) -> list[tuple[int, bytes]]:
    return [element(mixed) for mixed in source.build_from(context, start).take(LIMIT).as_numpy_iterator()]


@pytest.mark.parametrize("exhausted", [("repeat",) * 3, ("drop", "repeat", "stop")])
@pytest.mark.parametrize("pipelines", [1, 2, 3])
def test_the_memory_stream_is_the_file_stream_byte_for_byte(three_sources, exhausted, pipelines):
    context = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pipelines - 1)
    files, memory = mixture(three_sources, exhausted, False), mixture(three_sources, exhausted, True)
    for start in (0, 333, 1700):
        expected = records(files, context, start)
        assert expected or start, (exhausted, pipelines, start)  # a `stop` source may end the stream before start
        assert records(memory, context, start) == expected, (exhausted, pipelines, start)


def test_an_empty_file_keeps_its_place_in_an_unsharded_read(three_sources, tmp_path):
    # One input pipeline reads whole files through the interleave, an empty one too (it takes a turn).
    directory = tmp_path / "b"
    directory.mkdir()
    for path in sorted(glob.glob(three_sources["b"])):
        tf.io.gfile.copy(path, str(directory / os.path.basename(path)))
    tf.io.TFRecordWriter(str(directory / "train-00000-empty.tfrecord")).close()
    sources = dict(three_sources, b=str(directory / "*"))
    context = tf.distribute.InputContext()
    exhausted = ("repeat",) * 3
    assert records(mixture(sources, exhausted, True), context, 0) == records(mixture(sources, exhausted, False), context, 0)


def test_with_an_autotuned_cycle_the_indices_are_read_through_the_interleave_and_match(three_sources):
    # cycle_length autotune: the machine picks the interleave's cycle, so no epoch order is replayed
    # (read_order); the sources' indices go through the same interleave as their records.
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1)
    exhausted = ("repeat",) * 3
    memory = mixture(three_sources, exhausted, True, cycle_length="autotune")
    assert memory.parts[0].source.epoch_indices(context, tf.constant(0, tf.int64)) is None
    assert records(memory, context, 200) == records(mixture(three_sources, exhausted, False, cycle_length="autotune"),
                                                    context, 200)


def test_a_compressed_source_reads_the_same_from_memory(three_sources, tmp_path):
    sources = dict(three_sources, b=gzip_copy(three_sources["b"], tmp_path / "b"))
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0)
    kinds = ("", "GZIP", "")
    exhausted = ("repeat",) * 3
    expected = records(mixture(three_sources, exhausted, False), context, 100)
    assert records(mixture(sources, exhausted, False, kinds), context, 100) == expected
    assert records(mixture(sources, exhausted, True, kinds), context, 100) == expected


def test_after_the_first_read_no_file_is_read(three_sources, tmp_path):
    sources = {}
    for name, pattern in three_sources.items():  # a copy of the files, to delete mid-stream
        sources[name] = gzip_copy(pattern, tmp_path / name)
    kinds = ("GZIP",) * 3
    context = tf.distribute.InputContext()
    exhausted = ("repeat",) * 3
    expected = records(mixture(sources, exhausted, False, kinds), context, 0)
    stream = mixture(sources, exhausted, True, kinds).build_from(context, 0).as_numpy_iterator()
    got = [element(next(stream)) for _ in range(10)]  # every source has read all its records once
    for path in glob.glob(str(tmp_path / "*" / "*")):
        os.remove(path)
    got += [element(next(stream)) for _ in range(LIMIT - 10)]
    assert got == expected


def test_weights_changed_on_resume_read_the_same_from_memory(three_sources):
    # Two segments of weights, each laid out from the one cache: the stream across the change, and resumed after it.
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1)
    streams = {}
    for cache in (False, True):
        saved = mixture(three_sources, ("repeat",) * 3, cache).resume_state()
        changed = dataclasses.replace(mixture(three_sources, ("repeat",) * 3, cache), weights=(0.2, 0.3, 0.5))
        changed, message = changed.with_resume_state(saved, example=400, margin=0)
        assert message and "take effect at example 400" in message
        streams[cache] = records(changed, context, 0), records(changed, context, 900)
    assert streams[True] == streams[False]
    sources = [source for source, _ in streams[True][0]]
    assert sources[:400].count(2) / 400 < 0.25 < 0.45 < sources[400:].count(2) / len(sources[400:])  # 0.2, then 0.5


def data_config(sources, extra: str = "") -> DataConfig:
    listed = ", ".join(f"{{name: {name}, weight: {w}, source: {{files: '{path}'}}}}"
                       for (name, path), w in zip(sources.items(), (5, 3, 2)))
    text = f"mixture: {{sources: [{listed}]}}\nfeatures: {{id: {{dtype: int64}}}}\nbatch_size: 4\nrepeat: forever\n{extra}"
    return DataConfig.model_validate(yaml.safe_load(text), context={"prefix": "data"})


def plan_of(config: DataConfig):
    return make_plan(config, mixture_from_config(config))


def test_the_plan_caches_a_mixture_that_fits_and_says_why(three_sources):
    plan = plan_of(data_config(three_sources))
    assert plan.record_cache.value is True and plan.read.cache_records
    assert plan.record_cache.reason.startswith("auto: the mixture's ") and "fit the budget" in plan.record_cache.reason
    assert plan.data_bytes == sum(os.path.getsize(path) for pattern in three_sources.values()
                                  for path in glob.glob(pattern))


def test_the_plan_honours_cache_records_false_and_true(three_sources, tmp_path):
    off = plan_of(data_config(three_sources, "cache: {records: false}"))
    assert off.record_cache.value is False and off.record_cache.reason == "data.cache.records=false"
    assert not off.read.cache_records
    sources = dict(three_sources, b=gzip_copy(three_sources["b"], tmp_path / "b"))
    config = data_config(sources).model_copy(deep=True)
    config.mixture.sources[1].source.compression = "GZIP"
    compressed = plan_of(config)
    assert compressed.record_cache.value is False and "compressed files" in compressed.record_cache.reason
    config.cache.records = True
    assert plan_of(config).record_cache.value is True


def test_a_mixture_read_once_is_not_cached(three_sources):
    listed = ", ".join(f"{{name: {name}, weight: 1, source: {{files: '{path}'}}, exhausted: drop}}"
                       for name, path in three_sources.items())
    config = DataConfig.model_validate(yaml.safe_load(
        f"mixture: {{sources: [{listed}]}}\nfeatures: {{id: {{dtype: int64}}}}\nbatch_size: 4\nrepeat: 1"),
        context={"prefix": "data"})
    plan = plan_of(config)
    assert plan.record_cache.value is False and "read once" in plan.record_cache.reason
