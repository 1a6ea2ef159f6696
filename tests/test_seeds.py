"""The seed tree: every random choice derives from data.seed, per epoch, as a pure function."""
from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops import register_op, scoped_ops
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.pipeline.core import seeds
from tpu_pipeline.pipeline.stages.base import StageContext
from tpu_pipeline.pipeline.stages.map_features import MapFeatures
from tpu_pipeline.records.writer import int_feature, write_split

from helpers import plan_of

pytestmark = pytest.mark.tf_builds

NUM_FILES = 6


@pytest.fixture(scope="module")
def one_record_per_file(tmp_path_factory) -> str:
    """6 files, file k holding the single record with id k: the id stream is the file order."""
    directory = tmp_path_factory.mktemp("files")
    records = [tf.train.Example(features=tf.train.Features(feature={"id": int_feature(i)})).SerializeToString()
               for i in range(NUM_FILES)]
    write_split(records, str(directory), "train", NUM_FILES)
    return os.path.join(str(directory), "train-*.tfrecord")


def id_config(files: str, **overrides) -> dict:
    data = {
        "source": {"type": "tfrecord", "files": files, "cycle_length": 1, "num_parallel_calls": 0},
        "features": {"id": {"dtype": "int64"}}, "parse": "per_example",
        "shuffle": {"enabled": False}, "cache": {"records": False},
        "repeat": 3, "batch_size": 1, "drop_remainder": False, "options": {"deterministic": True},
    }
    data.update(overrides)
    return config_from_dict({"data": data}).data


def id_epochs(config, context=None, epochs: int = 3) -> list[list[int]]:
    ids = [int(batch["id"][0]) for batch in Pipeline.from_config(config).build(context)]
    per_epoch = len(ids) // epochs
    return [ids[e * per_epoch:(e + 1) * per_epoch] for e in range(epochs)]


def test_each_epoch_reads_the_file_order_the_tree_gives_for_it(one_record_per_file):
    for root in (0, 11):
        read = id_epochs(id_config(one_record_per_file, seed=root))
        expected = [seeds.file_order(NUM_FILES, root, epoch).numpy().tolist() for epoch in range(3)]
        assert read == expected
        assert len({tuple(order) for order in read}) == 3, "every epoch gets a fresh file order"
    assert id_epochs(id_config(one_record_per_file, seed=0)) != id_epochs(id_config(one_record_per_file, seed=11))


@pytest.mark.parametrize("sharding", ["auto", "file"])
def test_input_pipelines_share_the_file_order_so_shards_never_overlap(one_record_per_file, sharding):
    config = id_config(one_record_per_file, seed=5, batch_size=2,  # 2 replicas: one example per batch each
                       source={"type": "tfrecord", "files": one_record_per_file, "cycle_length": 1,
                               "num_parallel_calls": 0, "sharding": sharding})
    shards = [id_epochs(config, tf.distribute.InputContext(2, i, 2)) for i in range(2)]
    for epoch in range(3):
        order = seeds.file_order(NUM_FILES, 5, epoch).numpy().tolist()
        assert sorted(shards[0][epoch] + shards[1][epoch]) == list(range(NUM_FILES))
        if sharding == "auto":  # balanced: each pipeline reads a contiguous half of the epoch's records
            assert shards[0][epoch] == order[:3] and shards[1][epoch] == order[3:]
        else:
            assert shards[0][epoch] == order[0::2] and shards[1][epoch] == order[1::2]


def test_the_data_order_does_not_depend_on_tf_global_seed(one_record_per_file):
    """train.seed sets TF's global seed for the model; the data's shuffles come from data.seed only."""
    config = id_config(one_record_per_file, seed=2, shuffle={"buffer_size": 4})

    def ids() -> list[list[int]]:
        return id_epochs(config)

    try:
        baseline = ids()
        tf.random.set_seed(0)  # a global seed of 0 also used to fail inside the per-epoch function
        with_zero = ids()
        tf.random.set_seed(1234)
        with_other = ids()
    finally:
        tf.random.set_seed(None)
    assert baseline == with_zero == with_other
    assert len({tuple(epoch) for epoch in baseline}) == 3


def test_nodes_are_pure_and_distinct():
    assert seeds.node(0, seeds.SHUFFLE, 1) == seeds.node(0, seeds.SHUFFLE, 1)
    keys = {seeds.node(root, purpose, pipeline) for root in (0, 1) for purpose in
            (seeds.FILES, seeds.SHUFFLE, seeds.WINDOW_SHUFFLE, seeds.AUGMENT) for pipeline in (None, 0, 1)}
    assert len(keys) == 2 * 4 * 3
    a, b = (seeds.scalar(seeds.key(0, seeds.SHUFFLE, 0, epoch)).numpy() for epoch in (0, 1))
    assert a != b, "the epoch must reach the single seed tf.data's shuffle takes"
    with pytest.raises(ValueError, match="unknown seed purpose"):
        seeds.node(0, "colour")


def test_the_nth_element_of_a_pipeline_gets_the_trees_augment_seed(one_record_per_file):
    with scoped_ops():
        @register_op("record_seed", random=True)
        def record_seed():
            def fn(features, seed=None):
                return {**features, "seed": seed}
            return fn

        config = id_config(one_record_per_file, seed=9, augment=[{"op": "record_seed"}], repeat=1,
                           batch_size=2)
        got = [batch["seed"][0].numpy().tolist() for batch in Pipeline.from_config(config).build(
            tf.distribute.InputContext(2, 1, 2))]
    expected = [tf.random.experimental.stateless_fold_in(seeds.element_seed(9, seeds.AUGMENT, 1, n), 0).numpy().tolist()
                for n in range(len(got))]
    assert got == expected and len(got) == NUM_FILES // 2


def test_a_seed_does_not_change_the_order_mode(one_record_per_file):
    unset = id_config(one_record_per_file, options={})
    assert plan_of(unset).order.value is True  # in order unless asked: a resume is exact
    assert plan_of(id_config(one_record_per_file, options={}, seed=123)).order.value is True
    assert plan_of(id_config(one_record_per_file, options={"deterministic": False})).order.value is False


@pytest.mark.parametrize("section, key", [("shuffle", "seed"), ("source", "file_seed")])
def test_the_keys_the_tree_replaced_name_data_seed(one_record_per_file, section, key):
    raw = {"source": {"type": "tfrecord", "files": one_record_per_file}, "features": {"id": {"dtype": "int64"}},
           "batch_size": 1}
    raw[section] = {**raw.get(section, {}), key: 1}
    with pytest.raises(ConfigError, match=rf"data\.{section}\.{key} was removed; use data\.seed"):
        config_from_dict({"data": raw})


# The per-worker salt of the tf.data service: workers run one graph, so without a salt drawn where
# the graph runs they would augment their n-th element alike.

def test_the_salt_reaches_the_element_seed():
    position = tf.constant(5, tf.int64)
    plain = seeds.element_seed(9, seeds.AUGMENT, 0, position).numpy().tolist()
    salted = [seeds.element_seed(9, seeds.AUGMENT, 0, position, tf.constant(salt, tf.int64)).numpy().tolist()
              for salt in (12345, 67890, 12345)]
    assert salted[0] != salted[1], "two workers' salts must give two seeds for the same element"
    assert plain not in salted[:2]
    assert salted[0] == salted[2], "a salt is folded in purely"
    assert {seed[1] for seed in salted} == {plain[1]} == {5}, "the position stays the other half"


def test_each_run_of_one_graph_draws_its_own_salt():
    """Runs started a few milliseconds apart (the same second): a salt of whole seconds would repeat."""
    dataset = seeds.numbered_and_salted(tf.data.Dataset.range(3), start=7)
    runs = [[(int(element), int(position), int(salt)) for element, position, salt in dataset] for _ in range(4)]
    for run in runs:
        assert [(e, p) for e, p, _ in run] == [(0, 7), (1, 8), (2, 9)]
        assert len({salt for _, _, salt in run}) == 1 and run[0][2] != 0, "one nonzero salt per run"
    assert len({run[0][2] for run in runs}) == 4, f"runs drew equal salts: {[run[0][2] for run in runs]}"


def noise_of_runs(salted: bool, runs: int = 3) -> list[np.ndarray]:
    """A MapFeatures with one random op over 4 elements, iterated `runs` times: each run's noise."""
    def noise(features, seed=None):
        return {**features, "noise": tf.random.stateless_uniform([4], seed)}

    stage = MapFeatures(ops=(noise,), random_ops=(True,), seed=3, salted=salted, num_parallel_calls=1)
    dataset = stage.apply(tf.data.Dataset.range(4).map(lambda i: {"id": i}), StageContext())
    results = []
    for _ in range(runs):
        elements = list(dataset)
        assert [int(e["id"]) for e in elements] == [0, 1, 2, 3]
        results.append(np.stack([e["noise"].numpy() for e in elements]))
    return results


def test_a_salted_map_augments_differently_in_each_run_and_an_unsalted_one_alike():
    salted = noise_of_runs(True)
    for i in range(len(salted)):
        for j in range(i + 1, len(salted)):
            assert not np.array_equal(salted[i], salted[j]), f"salted runs {i} and {j} augmented alike"
    unsalted = noise_of_runs(False)
    assert all(np.array_equal(run, unsalted[0]) for run in unsalted), "the seed tree alone must repeat exactly"
    expected = [tf.random.stateless_uniform([4], tf.random.experimental.stateless_fold_in(
        seeds.element_seed(3, seeds.AUGMENT, 0, n), 0)).numpy() for n in range(4)]
    np.testing.assert_array_equal(unsalted[0], np.stack(expected))


# The record shuffle per epoch, where the file order cannot hide it: one file, so only the shuffle
# can change the order from one epoch to the next.

@pytest.fixture(scope="module")
def one_file(tmp_path_factory) -> str:
    """One file of 32 records, record k holding id k."""
    directory = tmp_path_factory.mktemp("one_file")
    records = [tf.train.Example(features=tf.train.Features(feature={"id": int_feature(i)})).SerializeToString()
               for i in range(32)]
    write_split(records, str(directory), "train", 1)
    return os.path.join(str(directory), "train-*.tfrecord")


def test_the_record_shuffle_changes_with_the_epoch_and_each_epoch_is_reproducible(one_file):
    config = id_config(one_file, seed=4, shuffle={"buffer_size": 32})
    assert plan_of(config).shuffle.value == "stream"
    epochs = id_epochs(config)
    for epoch in epochs:
        assert sorted(epoch) == list(range(32)), "each epoch is a permutation of the file"
    assert epochs[0] != list(range(32))
    assert len({tuple(epoch) for epoch in epochs}) == 3, f"epochs repeat an order: {epochs}"
    assert id_epochs(config) == epochs, "the same seed gives the same order, epoch by epoch"
    pipeline = Pipeline.from_config(config)
    for epoch in (1, 2):  # an epoch rebuilt on its own (as a resume does) has the order it had in the stream
        alone = [int(batch["id"][0]) for batch in pipeline.build(start=32 * epoch)]
        assert alone[:32] == epochs[epoch]


def test_the_shuffle_stage_folds_in_the_epoch():
    """The stage alone: its seed is (data.seed, pipeline, epoch), so epochs differ and each repeats."""
    from tpu_pipeline.pipeline.stages.shuffles import Shuffle

    def order(stage, epoch: int, pipeline: int = 0) -> list[int]:
        context = tf.distribute.InputContext(2, pipeline, 2)
        return [int(i) for i in stage.apply(tf.data.Dataset.range(64), StageContext(context, epoch=tf.constant(epoch, tf.int64)))]

    stage = Shuffle(buffer_size=64, seed=4)
    orders = [order(stage, epoch) for epoch in range(3)]
    assert all(sorted(o) == list(range(64)) for o in orders)
    assert len({tuple(o) for o in orders}) == 3, "each epoch must get its own order"
    assert [order(stage, epoch) for epoch in range(3)] == orders, "an epoch's order must be reproducible"
    assert order(stage, 0, pipeline=1) != orders[0], "each input pipeline gets its own order"
    fixed = Shuffle(buffer_size=64, seed=4, reshuffle_each_iteration=False)
    assert order(fixed, 0) == order(fixed, 1) == order(fixed, 2), "reshuffle_each_iteration=false: one order"
