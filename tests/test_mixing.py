"""Mixtures: the choice schedule's properties, and a mixture of real TFRecord sources positioned exactly.

The schedule is checked against a plain replay of its own choices (counts, positions), and the
mixture's stream against itself restarted at every tested position: a restarted stream must be the
exact rest of the uninterrupted one, for each `exhausted` policy.
"""
from __future__ import annotations


import numpy as np
import pytest
import tensorflow as tf
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.core.element_keys import RECORDS_KEY, SOURCE_KEY
from tpu_pipeline.pipeline.mixtures.mixture_source import MixturePart, MixtureSource
from tpu_pipeline.pipeline.mixtures.schedule import MixingSchedule, MixturePositions, block_quotas
from tpu_pipeline.pipeline.sources.base import ReadOptions
from tpu_pipeline.pipeline.sources.tfrecord import TFRecordSource
from tpu_pipeline.testing.data import write_tfrecords

pytestmark = pytest.mark.tf_builds

SMALL_BLOCK = 64  # a small block, so the properties cross many blocks in a short replay

weights_strategy = st.lists(st.integers(0, 20), min_size=1, max_size=5).filter(lambda w: sum(w) > 0)


def stream(schedule: MixingSchedule, start: int, count: int) -> np.ndarray:
    """The choices as the tf.data choice dataset yields them."""
    return np.array(list(schedule.choices(start).take(count).as_numpy_iterator()), np.int64)


def replay(schedule: MixingSchedule, start: int, count: int) -> np.ndarray:
    """The choices block by block, as a plain replay (what the closed forms must agree with)."""
    blocks = range(start // schedule.block, (start + count) // schedule.block + 1)
    whole = np.concatenate([schedule.block_choices(b) for b in blocks])
    offset = start - blocks[0] * schedule.block
    return whole[offset: offset + count]


def test_the_choice_dataset_yields_the_blocks_in_order_from_any_start():
    schedule = MixingSchedule((5.0, 3.0, 2.0), 7, SMALL_BLOCK)
    assert (stream(schedule, 0, 3 * SMALL_BLOCK) == replay(schedule, 0, 3 * SMALL_BLOCK)).all()
    assert (stream(schedule, 70, 100) == replay(schedule, 70, 100)).all()
    assert (stream(MixingSchedule((5.0, 3.0, 2.0), 8, SMALL_BLOCK), 0, 64) != replay(schedule, 0, 64)).any()


@settings(max_examples=15, deadline=None)
@given(weights=weights_strategy, seed=st.integers(0, 2**31), length=st.integers(1, 5 * SMALL_BLOCK))
def test_shares_never_drift_from_the_weights_by_more_than_a_block_quota(weights, seed, length):
    schedule = MixingSchedule(tuple(float(w) for w in weights), seed, SMALL_BLOCK)
    choices = replay(schedule, 0, length)
    counts = np.bincount(choices, minlength=len(weights))
    quotas = schedule.quotas
    assert np.all(np.abs(counts - length * quotas / SMALL_BLOCK) <= quotas)
    assert np.all(counts[np.asarray(weights) == 0] == 0)  # a zero weight is never chosen
    assert (schedule.counts(length) == counts).all()  # the closed form equals the replay


@settings(max_examples=15, deadline=None)
@given(weights=weights_strategy, seed=st.integers(0, 2**31), start=st.integers(0, 3 * SMALL_BLOCK))
def test_the_choices_from_any_position_are_the_rest_of_the_choices_from_zero(weights, seed, start):
    schedule = MixingSchedule(tuple(float(w) for w in weights), seed, SMALL_BLOCK)
    whole = replay(schedule, 0, start + SMALL_BLOCK)
    assert (replay(schedule, start, SMALL_BLOCK) == whole[start:]).all()
    # The same schedule built elsewhere (another host, a rerun) chooses the same.
    assert (replay(MixingSchedule(tuple(float(w) for w in weights), seed, SMALL_BLOCK), 0, start) == whole[:start]).all()


@settings(max_examples=10, deadline=None)
@given(weights=st.lists(st.integers(1, 9), min_size=2, max_size=4), seed=st.integers(0, 1000),
       totals=st.lists(st.integers(0, 40), min_size=4, max_size=4), stop=st.integers(0, 4))
def test_positions_of_sources_that_end_match_a_replay(weights, seed, totals, stop):
    """drop: past its end a source's choices are passed over; stop: its first choice past the end ends it."""
    schedule = MixingSchedule(tuple(float(w) for w in weights), seed, SMALL_BLOCK)
    k = len(weights)
    ends = tuple(totals[:k])
    stops = tuple(index == stop for index in range(k))
    positions = MixturePositions(schedule, ends, stops)
    delivered, taken, position = [], [0] * k, 0
    for source in replay(schedule, 0, 64 * SMALL_BLOCK):  # long enough for 41 choices of a quota of 1
        if taken[source] >= ends[source]:
            if stops[source]:
                break
        else:
            taken[source] += 1
            delivered.append(position)
        position += 1
        if all(t >= e for t, e in zip(taken, ends)):
            break
    assert positions.length == len(delivered)
    for n in sorted({0, 1, len(delivered) // 2, len(delivered) - 1}):
        if 0 <= n < len(delivered):
            m = positions.locate(n)
            assert m == (delivered[n - 1] + 1 if n else 0)  # right after the n-th delivered choice
            assert int(positions.taken(m).sum()) == n


def test_quotas_and_weight_errors_are_one_line():
    assert block_quotas([0.5, 0.3, 0.2]).tolist() == [2048, 1229, 819]
    assert block_quotas([1, 1, 1]).sum() == 4096
    for bad in ([0, 0], [-1, 2], [float("nan"), 1]):
        with pytest.raises(ConfigError, match="weights must be finite, non-negative and not all zero"):
            block_quotas(bad)
    with pytest.raises(ConfigError, match="below 1/4096"):
        block_quotas([1e-6, 1])


@pytest.fixture(scope="module")
def three_sources(tmp_path_factory):
    """Three small TFRecord sources (50, 30 and 20 records, ids 0..n-1, 2 files each)."""
    root = tmp_path_factory.mktemp("mixture")
    return {name: write_tfrecords(root / name, {"x": {"dtype": "int64"}}, count, num_shards=2)
            for name, count in (("web", 50), ("code", 30), ("books", 20))}


def mixture(files, exhausted=("repeat", "repeat", "repeat"), weights=(0.5, 0.3, 0.2), shuffle=16, seed=1):
    parts = tuple(MixturePart(name, TFRecordSource(files=path), weight, policy)
                  for (name, path), weight, policy in zip(files.items(), weights, exhausted))
    return MixtureSource(parts, weights, seed=seed, shuffle_buffer=shuffle).with_read(ReadOptions(seed=seed))


SPEC = {"id": tf.io.FixedLenFeature([], tf.int64)}


def examples(dataset, limit=None):
    dataset = dataset.map(lambda element: {**tf.io.parse_single_example(element[RECORDS_KEY], SPEC),
                                           SOURCE_KEY: element[SOURCE_KEY]})
    dataset = dataset.take(limit) if limit is not None else dataset
    return [(int(e[SOURCE_KEY]), int(e["id"])) for e in dataset.as_numpy_iterator()]


@pytest.mark.parametrize("exhausted", [("repeat", "repeat", "repeat"), ("repeat", "drop", "stop"),
                                       ("drop", "drop", "drop"), ("stop", "repeat", "repeat")])
def test_a_restarted_mixture_is_the_exact_rest_of_the_uninterrupted_one(three_sources, exhausted):
    source = mixture(three_sources, exhausted)
    context = tf.distribute.InputContext()
    whole = examples(source.build(context), limit=260)
    length = source.positions(context).length
    if length is not None:
        assert len(whole) == length
    for start in (1, 17, 64, 101, len(whole) - 1, len(whole)):
        assert examples(source.build_from(context, start), limit=260 - start) == whole[start:], start


def test_each_policy_ends_its_own_way(three_sources):
    context = tf.distribute.InputContext()
    # drop everywhere: every record of every source exactly once, then the end.
    dropped = examples(mixture(three_sources, ("drop",) * 3).build(context))
    assert sorted(dropped) == sorted([(0, i) for i in range(50)] + [(1, i) for i in range(30)] + [(2, i) for i in range(20)])
    # stop on books: the mixture ends at books' first choice past its 20 records; none repeats.
    stopped = examples(mixture(three_sources, ("repeat", "repeat", "stop")).build(context))
    assert sorted(i for s, i in stopped if s == 2) == list(range(20))
    for source, epoch in ((0, 50), (1, 30)):  # the others repeat: no record twice within one of their epochs
        ids = [i for s, i in stopped if s == source]
        assert all(len(set(ids[k:k + epoch])) == len(ids[k:k + epoch]) for k in range(0, len(ids), epoch))
    # repeat: each source's epoch holds each of its records once, epoch after epoch, in a new order.
    repeated = examples(mixture(three_sources).build(context), limit=400)
    code = [i for s, i in repeated if s == 1]
    assert sorted(code[:30]) == list(range(30)) and sorted(code[30:60]) == list(range(30)) and code[:30] != code[30:60]


def test_every_record_exactly_once_per_source_epoch_over_two_input_pipelines(three_sources):
    source = mixture(three_sources, ("drop",) * 3)
    seen = []
    for index in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=index, num_replicas_in_sync=8)
        seen += examples(source.build(context))
    # Balanced shares: each pipeline reads an equal run of each source (an odd record is left out).
    for source_index, count in enumerate((50, 30, 20)):
        ids = [i for s, i in seen if s == source_index]
        assert len(ids) == len(set(ids)) == count - count % 2


def test_the_shares_delivered_follow_the_weights(three_sources):
    repeated = examples(mixture(three_sources).build(tf.distribute.InputContext()), limit=4096)
    shares = np.bincount([s for s, _ in repeated], minlength=3) / len(repeated)
    assert np.allclose(shares, [0.5, 0.3, 0.2], atol=1e-3)


def data_config(text: str) -> DataConfig:
    return DataConfig.model_validate(yaml.safe_load(text), context={"prefix": "data"})


@pytest.mark.parametrize("text, message", [
    ("mixture: {sources: [{name: a, weight: 1, source: {dir: d}}, {name: a, weight: 2, source: {dir: e}}]}",
     r"data.mixture.sources\[1\] \(a\).name: 'a' is used twice"),
    ("mixture: {sources: [{name: a, weight: 0, source: {dir: d}}]}", "data.mixture: every weight is 0"),
    ("mixture: {sources: [{name: a, weight: -1, source: {dir: d}}]}", r"weight: -1.0 must be a finite number >= 0"),
    ("mixture: {sources: []}", "data.mixture.sources: list the sources to mix"),
    ("source: {type: tfrecord, dir: d}\nmixture: {sources: [{name: a, weight: 1, source: {dir: d}}]}",
     "give exactly one of data.source .* or data.mixture .*; both are set"),
    ("mixture: {sources: [{name: a, weight: 1, source: {files: 'x/*'}}]}", r"sources\[0\] \(a\): its records need a feature spec"),
])
def test_mixture_config_errors_are_one_line(text, message):
    with pytest.raises(ConfigError, match=message):
        data_config(text + "\nbatch_size: 4\nrepeat: forever")


def test_a_mixture_that_repeats_needs_repeat_forever():
    with pytest.raises(ConfigError, match="data.repeat=1: a mixture's sources end their own way"):
        data_config("mixture: {sources: [{name: a, weight: 1, source: {dir: d}}]}\nbatch_size: 4")
    data_config("mixture: {sources: [{name: a, weight: 1, source: {dir: d}, exhausted: stop}]}\nbatch_size: 4")


def test_a_mixture_config_builds_a_pipeline_of_the_mixed_records(three_sources):
    from tpu_pipeline.pipeline.builder import Pipeline

    sources = ", ".join(f"{{name: {name}, weight: {w}, source: {{files: '{path}'}}, exhausted: drop}}"
                        for (name, path), w in zip(three_sources.items(), (5, 3, 2)))
    config = data_config(f"mixture: {{sources: [{sources}]}}\nfeatures: {{id: {{dtype: int64}}}}\n"
                         "batch_size: 4\nrepeat: 1\nseed: 3")
    pipeline = Pipeline.from_config(config)
    assert pipeline.plan.shuffle.value == "off" and "each source shuffles its own" in pipeline.plan.shuffle.reason
    ids = np.concatenate([batch["id"] for batch in pipeline.build().as_numpy_iterator()])
    assert len(ids) == 100  # 50 + 30 + 20: every record of every source once
