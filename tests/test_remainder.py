"""A resume on another number of input pipelines (issue 51): the rest of the interrupted epoch dealt to the
new pipelines (`pipeline/core/remainder.py`), every example of every epoch once, and from the next epoch on
the stream a run started on the new number has.

First the arithmetic alone, against a model of balanced sharding (pipeline i of h reads records
[i*L, (i+1)*L) of each epoch's order, L = N // h), over random sequences of layouts; then the real
pipelines, built from TFRecord files, read through 2 -> 1 -> 3 -> 2 input pipelines."""
from __future__ import annotations

import collections
import os
import random

import pytest
import tensorflow as tf

from tpu_pipeline.pipeline.core.remainder import Layout, Remainder

pytestmark = pytest.mark.tf_builds


def record(hosts: int, index: int, position: int, num: int) -> tuple[int, int]:
    """(epoch, record) that pipeline `index` of `hosts` reads at stream `position` (balanced sharding)."""
    length = num // hosts
    epoch, offset = divmod(position, length)
    return epoch, index * length + offset


def read(layout: Layout, index: int, step: int, count: int, num: int) -> list[tuple[int, int]]:
    """The `count` (epoch, record)s pipeline `index` reads from global step `step` on, one example a step."""
    start, remainder = layout.place(index, step, 1)
    reads = []
    if remainder is not None:
        share = remainder.record_order()[remainder.taken + index::layout.hosts]
        reads = [record(remainder.hosts, old, position, num) for old, position in share[:count]]
        start = remainder.start(layout.hosts, index, num // layout.hosts)
        assert start + len(share) == (remainder.epoch + 1) * (num // layout.hosts)
        start += len(share)
    return reads + [record(layout.hosts, index, p, num) for p in range(start, start + count - len(reads))]


@pytest.mark.parametrize("seed", range(40))
def test_any_sequence_of_layouts_reads_every_record_of_every_epoch_once(seed):
    rng = random.Random(seed)
    num = 60  # every host count below divides it: balanced shards leave nothing out
    layout, step = Layout((0,) * rng.choice([1, 2, 3, 4, 5, 6])), 0
    seen: collections.Counter = collections.Counter()
    for _ in range(rng.randint(2, 7)):
        steps = rng.randint(1, 40)
        for index in range(layout.hosts):
            seen.update(read(layout, index, step, steps, num))
        step += steps
        layout = layout.at(step, 1)
        new_hosts = rng.choice([1, 2, 3, 4, 5, 6])
        layout = layout.dealt_to(new_hosts, num // layout.hosts, num // new_hosts)
    assert max(seen.values()) == 1, [key for key, times in seen.items() if times > 1][:5]
    epochs = collections.Counter(epoch for epoch, _ in seen)
    last = max(epochs)
    assert all(epochs[epoch] == num for epoch in range(last)), epochs  # only the last epoch is partly read


def test_the_remainder_is_dealt_in_turns_and_shares_differ_by_one_at_most():
    remainder = Remainder(examples=(7, 8), length=10)  # old pipeline 0 stood at 7, pipeline 1 at 8 (epoch 0)
    assert remainder.epoch == 0 and remainder.total == 5
    assert remainder.record_order() == [(0, 7), (1, 8), (0, 8), (1, 9), (0, 9)]
    assert [remainder.share(3, j) for j in range(3)] == [2, 2, 1]
    assert [remainder.start(3, j, length=6) for j in range(3)] == [4, 4, 5]  # epoch 1 begins at 6 for each
    assert remainder.after(3, 1).taken == 3 and remainder.after(3, 2) is None
    at_epoch_ends = Remainder(examples=(10, 20), length=10)  # pipeline 1 finished epoch 1, pipeline 0 epoch 0
    assert at_epoch_ends.epoch == 1 and at_epoch_ends.left(0) == 10 and at_epoch_ends.left(1) == 0
    assert Remainder(examples=(10, 10), length=10).total == 0  # both at an epoch's end: nothing left over
    layout = Layout((7, 8), step=3).dealt_to(1, 10, 20)
    assert layout == Layout((15,), 3, remainder) and Layout.from_json(layout.to_json()) == layout


# --- the real pipelines ------------------------------------------------------------------------------

NUM, GLOBAL_BATCH = 96, 12  # 1, 2 and 3 pipelines: 12, 6 and 4 examples a step each


@pytest.fixture(scope="module", params=["per_example", "per_example_files", "batched", "cached", "pad"])
def pipeline(request, tmp_path_factory):
    """Shuffled TFRecords read in each plan: per example (JPEGs decoded and flipped at random: element seeds),
    with the records held in memory after epoch 0 (a small set's default) or read from the files each epoch
    in that epoch's file order (a large set's); batch-then-parse from the files (the interleave moves blocks
    of records, a window shuffle); or per example with the decoded examples cached to files (each epoch
    reshuffles epoch 0's: the old hosts' are rebuilt uncached); or token sequences in pad mode."""
    from tpu_pipeline import Pipeline
    from tpu_pipeline.config import config_from_dict
    from tpu_pipeline.testing import write_tfrecords

    directory = tmp_path_factory.mktemp("records")
    augment = []
    if request.param != "batched":
        features = {"image": {"dtype": "string"}, "label": {"dtype": "int64"}}
        ops, augment = [{"op": "decode_image", "format": "jpeg"}], [{"op": "random_flip"}]
    else:
        features = {"features": {"dtype": "float32", "shape": [4]}}
        ops = [{"op": "cast", "key": "id", "dtype": "int32"}]
    sequence = {}
    if request.param == "pad":  # each example 5 token ids, padded to 8 with a mask
        features, ops, augment = {"tokens": {"dtype": "int64", "shape": [5]}}, [], []
        sequence = {"sequence": {"keys": ["tokens"], "length": 8, "mode": "pad"}}
    files = write_tfrecords(directory, features, num=NUM, num_shards=4, image_size=8)
    if request.param == "pad":
        features = {"tokens": {"dtype": "int64", "kind": "ragged"}}
    data = config_from_dict({"data": {**sequence,
        "source": {"type": "tfrecord", "files": files}, "features": {**features, "id": {"dtype": "int64"}},
        "preprocess": ops, "augment": augment, "batch_size": GLOBAL_BATCH, "repeat": "forever", "seed": 5,
        "parse": "batched" if request.param == "batched" else "per_example",
        "cache": {"enabled": request.param == "cached", "path": str(directory / "cache") if request.param == "cached" else "",
                  "records": "auto" if request.param == "per_example" else False}}}).data
    built = Pipeline.from_config(data)
    assert built.deals_remainders
    if request.param != "pad":
        assert built.plan.batched == (request.param == "batched"), built.plan
        assert built.plan.record_cache.value == (request.param == "per_example"), built.plan.record_cache
    return built


def context(index: int, hosts: int) -> tf.distribute.InputContext:
    return tf.distribute.InputContext(num_input_pipelines=hosts, input_pipeline_id=index, num_replicas_in_sync=hosts)


def examples(dataset: tf.data.Dataset, batches: int) -> list[dict]:
    """The first `batches` batches, as one list of examples (numpy values)."""
    return [{key: value[row] for key, value in batch.items()}
            for batch in dataset.take(batches).as_numpy_iterator() for row in range(len(batch["id"]))]


def test_two_then_one_then_three_then_two_pipelines_read_every_example_of_every_epoch_once(pipeline):
    lengths = {hosts: pipeline.source.epoch_length(context(0, hosts)) for hosts in (1, 2, 3)}
    assert lengths == {1: NUM, 2: NUM // 2, 3: NUM // 3}
    layout, step, ids = Layout((0, 0)), 0, []
    last_streams = {}
    for hosts, steps in ((2, 3), (1, 2), (3, 5), (2, 7)):
        layout = layout.dealt_to(hosts, lengths[layout.hosts], lengths[hosts])
        per_step = GLOBAL_BATCH // hosts
        reads = []
        for index in range(hosts):
            start, remainder = layout.place(index, step, per_step)
            last_streams[index] = (start, remainder)
            read = examples(pipeline.build(context(index, hosts), start=start, remainder=remainder), steps)
            reads.append([int(example["id"]) for example in read])
        ids += [i for s in range(steps) for index in range(hosts) for i in reads[index][s * per_step:(s + 1) * per_step]]
        step += steps
        layout = layout.at(step, per_step)
    assert len(ids) == 3 * 12 + 2 * 12 + 5 * 12 + 7 * 12 == 2 * NUM + 12
    counts = collections.Counter(ids)
    assert set(counts) <= set(range(NUM)) and sorted(collections.Counter(counts.values()).items()) == [(2, 84), (3, 12)]
    for epoch in range(2):  # pipelines in lockstep with no epoch ends apart: each epoch is 8 steps of 12
        assert sorted(ids[epoch * NUM:(epoch + 1) * NUM]) == list(range(NUM)), epoch


def test_after_the_remainder_each_pipeline_reads_what_a_run_started_on_its_number_reads(pipeline):
    """2 pipelines stopped 3 steps into epoch 0, dealt to 3: each of the 3 reads its share, then epoch 1 of
    3 pipelines example for example (records, and the random flips: element seeds count from its place)."""
    old = Layout((0, 0)).at(3, GLOBAL_BATCH // 2)
    layout = old.dealt_to(3, NUM // 2, NUM // 3)
    assert layout.remainder == Remainder((18, 18), NUM // 2) and layout.examples == (12, 12, 12)
    cache_dir = pipeline.parts.once[-1].path if pipeline.parts.once else None
    for name in os.listdir(cache_dir) if cache_dir else ():  # what the 2 hosts' own runs cached (other tests)
        if "-of-2." in name:
            os.remove(os.path.join(cache_dir, name))
    dealt = [examples(pipeline.build(context(index, 3), start=start, remainder=remainder), 20)
             for index, (start, remainder) in ((i, layout.place(i, 3, GLOBAL_BATCH // 3)) for i in range(3))]
    if cache_dir:  # the 2 old hosts' rests were read with no cache of theirs written (this slice has no such host)
        assert not [name for name in os.listdir(cache_dir) if "-of-2." in name], os.listdir(cache_dir)
    # Each share: old pipeline 0's and 1's rest of epoch 0, in turns, every third from the new pipeline's index on.
    rest = [examples(pipeline.build(context(old_index, 2), start=18), 5) for old_index in range(2)]
    turns = [int(e["id"]) for pair in zip(*rest) for e in pair]
    for index in range(3):
        share = layout.remainder.share(3, index)
        fresh = examples(pipeline.build(context(index, 3), start=NUM // 3), 12)
        assert share == 20 and len(dealt[index]) - share == 60 and len(fresh) == 48
        assert [int(e["id"]) for e in dealt[index][:share]] == turns[index::3]
        assert [int(e["id"]) for e in dealt[index][share:share + 48]] == [int(e["id"]) for e in fresh]
        for ours, theirs in zip(dealt[index][share:], fresh):
            for key in ours:
                assert (ours[key] == theirs[key]).all(), (index, key)
