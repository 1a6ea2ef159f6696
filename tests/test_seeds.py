"""The seed tree: every random choice derives from data.seed, per epoch, as a pure function."""
from __future__ import annotations

import os

import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops import register_op, scoped_ops
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.pipeline import seeds
from tpu_pipeline.records.writer import int_feature, write_split

from helpers import plan_of

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
