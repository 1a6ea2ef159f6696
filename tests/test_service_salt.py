"""Each tf.data service worker shuffles in an order of its own (data.service mode parallel_epochs).

Every worker runs the same graph, so with the seed tree alone each would read the files and shuffle
the records in the same order, and a step's batches from two workers would repeat each other. The
salted stream (`Pipeline._stream(..., salted=True)`, what a worker runs) folds a value drawn where
the graph runs (`seeds.runtime_salt()`) into the epoch; each iteration of the dataset is such a run.
"""
from __future__ import annotations

import tensorflow as tf

import pytest

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.pipeline import Pipeline

from helpers import small_config, write_small_shards

pytestmark = pytest.mark.tf_builds

RUNS = 4


def _orders(dataset: tf.data.Dataset) -> list[tuple[int, ...]]:
    """The ids of one whole pass, in order, for each of RUNS iterations of the same dataset."""
    return [tuple(int(i) for batch in dataset for i in batch["id"].numpy()) for _ in range(RUNS)]


def test_each_run_of_a_salted_stream_has_its_own_order_and_an_unsalted_one_does_not(tmp_path):
    files, _ = write_small_shards(tmp_path, 256, 8)
    pipeline = Pipeline.from_config(config_from_dict({"data": small_config(files, batch_size=32)}).data)
    stages = pipeline.parts
    context = tf.distribute.InputContext()

    unsalted = _orders(pipeline._stream(stages, context))
    assert len(set(unsalted)) == 1 and sorted(unsalted[0]) == list(range(256))  # the seed tree alone: one order

    salted = _orders(pipeline._stream(stages, context, salted=True))
    assert all(sorted(order) == list(range(256)) for order in salted)  # each run still one whole epoch
    assert len(set(salted)) == RUNS, "every run (service worker) of the salted stream must shuffle its own way"
    assert unsalted[0] not in salted
