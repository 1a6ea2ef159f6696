"""The window shuffle: every record once, within its window, reproducible, checkpointable."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline import Batch, Pipeline, Repeat, WindowShuffle
from tpu_pipeline.pipeline.stages.base import StageContext

from tpu_pipeline.format import write_metadata
from tpu_pipeline.records.writer import write_split

from helpers import plan_of, small_config, small_examples, write_small_shards

pytestmark = pytest.mark.tf_builds

CONTEXT = StageContext()
RECORDS = [f"r{i:05d}".encode() for i in range(2500)]


def records(blocks: int = 0) -> tf.data.Dataset:
    dataset = tf.data.Dataset.from_tensor_slices(RECORDS)
    return dataset.batch(blocks) if blocks else dataset


def windows(dataset: tf.data.Dataset, **kwargs) -> list[list[bytes]]:
    stage = WindowShuffle(**{"window": 1000, "seed": 7, **kwargs})
    return [w.tolist() for w in stage.apply(dataset, CONTEXT).as_numpy_iterator()]


@pytest.mark.parametrize("blocks", [0, 256, 7])
def test_every_record_once_and_only_within_its_window(blocks):
    out = windows(records(blocks))
    assert [len(w) for w in out] == [1000, 1000, 500]
    for index, window in enumerate(out):
        assert sorted(window) == RECORDS[1000 * index:1000 * index + len(window)]
        assert window != RECORDS[1000 * index:1000 * index + len(window)]  # actually permuted


def test_permutation_spreads_records_like_a_uniform_shuffle():
    window = windows(records())[0]
    displacement = [abs(int(record[1:]) - position) for position, record in enumerate(window)]
    # A uniform random permutation of n moves a record (n^2 - 1) / 3n positions on average: 333 here.
    assert 300 < np.mean(displacement) < 367
    assert sum(d == 0 for d in displacement) < 10


def test_same_seed_same_order_and_a_new_order_each_epoch():
    assert windows(records()) == windows(records())
    assert windows(records()) != windows(records(), seed=8)

    def epoch(number: int, **kwargs) -> list[bytes]:
        stage = WindowShuffle(window=1000, seed=7, **kwargs)
        return next(stage.apply(records().take(1000), StageContext(epoch=tf.constant(number, tf.int64))).as_numpy_iterator()).tolist()

    assert sorted(epoch(0)) == sorted(epoch(1)) and epoch(0) != epoch(1)
    assert epoch(1) == epoch(1)  # a pure function of (seed, epoch, window)
    assert epoch(0, reshuffle_each_iteration=False) == epoch(1, reshuffle_each_iteration=False)


def test_iterator_checkpoint_resumes_the_same_order(tmp_path):
    def build():
        stage = WindowShuffle(window=100, seed=3)
        epochs = Repeat(None).epochs(lambda epoch: stage.apply(records(64), StageContext(epoch=epoch)))
        return Batch(50, records=True).apply(epochs, CONTEXT)

    iterator = iter(build())
    for _ in range(70):  # past the first epoch (50 batches)
        next(iterator)
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    expected = [next(iterator).numpy().tolist() for _ in range(9)]
    restored = iter(build())
    tf.train.Checkpoint(iterator=restored).restore(path)
    assert [next(restored).numpy().tolist() for _ in range(9)] == expected


def test_batch_cuts_vectors_of_records_into_exact_batches():
    dataset = WindowShuffle(window=1000, seed=1).apply(records(256), CONTEXT)
    batches = [b.tolist() for b in Batch(64, drop_remainder=False, records=True).apply(dataset, CONTEXT).as_numpy_iterator()]
    assert [len(b) for b in batches] == [64] * 39 + [4]
    assert sorted(r for b in batches for r in b) == RECORDS


def test_window_shuffle_refuses_parsed_features():
    features = tf.data.Dataset.from_tensor_slices({"x": np.arange(4)})
    with pytest.raises(ConfigError, match="data.shuffle.mode=stream"):
        WindowShuffle().apply(features, CONTEXT)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_small_shards(tmp_path_factory.mktemp("small"), 3000, num_shards=4)


def test_auto_mode_windows_only_batch_then_parse_pipelines(shards):
    files, _ = shards
    assert plan_of(config_from_dict({"data": small_config(files)}).data).shuffle.value == "window"
    per_example = small_config(files, parse="per_example")
    assert plan_of(config_from_dict({"data": per_example}).data).shuffle.value == "stream"
    per_example["shuffle"] = {**per_example["shuffle"], "mode": "window"}
    with pytest.raises(ConfigError, match="data.shuffle.mode=window .* use data.shuffle.mode=stream"):
        Pipeline.from_config(config_from_dict({"data": per_example}).data)


def test_a_converted_dataset_dir_delivers_every_record_once_in_windows(tmp_path):
    values = np.random.default_rng(1).normal(size=(1500, 16)).astype(np.float32)
    split = write_split(small_examples(values), str(tmp_path), "train", 3)
    features = {"features": {"dtype": "float32", "shape": [16]}, "label": {"dtype": "int64"}, "id": {"dtype": "int64"}}
    write_metadata(str(tmp_path), {"features": features, "splits": {"train": split}})
    raw = small_config("unused", source={"type": "tfrecord", "dir": str(tmp_path)})
    config = config_from_dict({"data": {**raw, "features": {}}}).data
    ids = [i for batch in Pipeline.from_config(config).build() for i in batch["id"].numpy().tolist()]
    assert sorted(ids) == list(range(1500)) and ids != sorted(ids)
