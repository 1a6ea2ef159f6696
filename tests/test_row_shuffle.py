"""The row shuffle after packing, by its properties (not by recorded batches).

Pack mode permutes the rows of each pool of `row_shuffle` windows with a seed of the seed tree folded
with the pool's first (example, chunk). Held here on a corpus made so that pools hold the same rows:
32 documents of one chunk each, the second 16 a copy of the first 16, read twice in file order (no
data shuffle). With windows of 8 and pools of 2 windows, an epoch is two pools with the same rows, and
the second epoch repeats the first. So:

- two pools with the same rows leave in different orders;
- the same pool position gets another order in the next epoch;
- the order is a pure function of the seed: the same with the same data.seed, another with another,
  and always a permutation of the rows packed.
"""
from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
import yaml

from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.records.writer import write_split

pytestmark = pytest.mark.tf_builds

DOCUMENTS = 16  # distinct documents; the corpus holds each twice (the copy right after the originals)
WINDOW, POOL, LENGTH = 8, 2, 16


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    rng = np.random.default_rng(3)
    documents = [rng.integers(1, 1000, size=int(rng.integers(3, LENGTH))).tolist() for _ in range(DOCUMENTS)]
    records = [tf.train.Example(features=tf.train.Features(feature={"tokens": tf.train.Feature(
        int64_list=tf.train.Int64List(value=tokens))})).SerializeToString() for tokens in documents * 2]
    root = tmp_path_factory.mktemp("rows")
    write_split(iter(records), str(root), "train", 1)
    return str(root / "train-*.tfrecord")


def pools(corpus: str, seed: int) -> list[list[tuple[int, ...]]]:
    """Each pool's rows (their tokens) in the order they leave, pools in stream order, over two epochs."""
    text = {"source": {"type": "tfrecord", "files": corpus}, "features": {"tokens": {"dtype": "int64", "kind": "ragged"}},
            "sequence": {"keys": ["tokens"], "length": LENGTH, "mode": "pack", "window": WINDOW, "row_shuffle": POOL},
            "shuffle": {"enabled": False}, "repeat": 2, "batch_size": 4, "drop_remainder": False, "seed": seed}
    config = DataConfig.model_validate(yaml.safe_load(yaml.safe_dump(text)), context={"prefix": "data"})
    by_pool: dict[tuple[int, int, int], list[tuple[int, ...]]] = collections.OrderedDict()
    for batch, position in Pipeline.from_config(config).build(with_position=True).as_numpy_iterator():
        for row, hi, example, chunk in zip(batch["tokens"], position["_example_hi"], position["_example"],
                                           position["_chunk"]):
            by_pool.setdefault((int(hi), int(example), int(chunk)), []).append(tuple(int(t) for t in row))
    return list(by_pool.values())


def test_pools_with_the_same_rows_leave_in_different_orders_each_epoch_anew(corpus):
    first, second, again, later = pools(corpus, seed=7)  # epoch 1: two pools; epoch 2: the same two
    assert len(first) > 4 and sorted(first) == sorted(second) == sorted(again) == sorted(later)
    assert first != second  # the same rows, another pool: another order
    assert first != again and second != later  # the same pool position, the next epoch: another order
    assert len({tuple(pool) for pool in (first, second, again, later)}) == 4


def test_the_order_is_a_pure_function_of_the_seed(corpus):
    seven = pools(corpus, seed=7)
    assert pools(corpus, seed=7) == seven  # built again: the same
    eight = pools(corpus, seed=8)
    assert [sorted(pool) for pool in eight] == [sorted(pool) for pool in seven]  # the same rows packed
    assert all(a != b for a, b in zip(eight, seven))  # each pool in another order
