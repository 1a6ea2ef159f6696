"""data.cache.records: serialized records held in memory after epoch 1, every epoch a full shuffle."""
from __future__ import annotations

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.bench.ceilings import Ceilings
from tpu_pipeline.bench.doctor import findings_for
from tpu_pipeline.bench.measure import Measurement
from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.pipeline import plan as planning

from tpu_pipeline.format import write_metadata
from tpu_pipeline.records.writer import write_split

from helpers import data_config, jpeg_examples, plan_of, small_config, write_jpeg_shards, write_small_shards

pytestmark = pytest.mark.tf_builds

N_IMAGES = 120


def images(files: str, **overrides):
    """A per-example JPEG pipeline that repeats (what auto caches), ids as the only output."""
    config = data_config(files, repeat="forever", batch_size=40, parse="per_example", **overrides)
    config["preprocess"] = [{"op": "cast", "key": "id", "dtype": "int32"}, {"op": "keep", "keys": ["id"]}]
    config["shuffle"] = {"buffer_size": 2}  # a tiny buffer: any real mixing comes from the full shuffle
    config["options"] = {"deterministic": None}
    return config_from_dict({"data": config}).data


def epochs(dataset: tf.data.Dataset, batches_per_epoch: int, count: int, before_each=None) -> list[list[int]]:
    iterator = iter(dataset)
    out = []
    for epoch in range(count):
        if before_each:
            before_each(epoch)
        ids = [int(i) for _ in range(batches_per_epoch) for i in next(iterator)["id"].numpy()]
        out.append(ids)
    return out


def delete_files_after_first_epoch(pattern: str):
    def before(epoch: int) -> None:
        if epoch == 1:
            for path in glob.glob(pattern):
                os.remove(path)
    return before


def mean_move(first: list[int], second: list[int]) -> float:
    where = {value: index for index, value in enumerate(first)}
    return float(np.mean([abs(where[value] - index) for index, value in enumerate(second)]))


def test_auto_caches_uncompressed_files_that_fit_for_repeated_pipelines(tmp_path, monkeypatch):
    files = write_jpeg_shards(tmp_path / "plain", N_IMAGES, 4)
    config = images(files)
    assert plan_of(config).record_cache.value
    assert not plan_of(config.model_copy(update={"repeat": 1})).record_cache.value  # one pass: nothing to reuse
    assert not plan_of(config.model_copy(update={"cache": config.cache.model_copy(update={"enabled": True})})).record_cache.value
    assert not plan_of(config.model_copy(update={"cache": config.cache.model_copy(update={"records": False})})).record_cache.value
    unshuffled = config.model_copy(update={"shuffle": config.shuffle.model_copy(update={"enabled": False})})
    assert not plan_of(unshuffled).record_cache.value  # the cache would freeze the per-epoch file order
    fixed_order = unshuffled.model_copy(update={"source": config.source.model_copy(update={"shuffle_files": False})})
    assert plan_of(fixed_order).record_cache.value  # nothing random to freeze
    gzipped = write_jpeg_shards(tmp_path / "gz", N_IMAGES, 4, compression="GZIP")
    assert not plan_of(images(gzipped).model_copy(update={
        "source": config.source.model_copy(update={"files": gzipped, "compression": "GZIP"})})).record_cache.value
    small, _ = write_small_shards(tmp_path / "small", 512, 2)
    batched = config_from_dict({"data": small_config(small, repeat="forever")}).data
    assert plan_of(batched).record_cache.value  # blocks of records, then a window shuffle: cached
    stream = batched.model_copy(update={"shuffle": batched.shuffle.model_copy(update={"mode": "stream"})})
    assert not plan_of(stream).record_cache.value  # a full shuffle of single small records costs more than it saves
    size = sum(os.path.getsize(p) for p in glob.glob(files))
    monkeypatch.setattr(planning, "RECORD_CACHE_MAX_BYTES", size - 1)
    assert not plan_of(config).record_cache.value
    monkeypatch.setattr(planning, "RECORD_CACHE_MAX_BYTES", size)
    assert plan_of(config).record_cache.value


def test_explicit_true_is_refused_where_it_cannot_apply(tmp_path):
    config = images(write_jpeg_shards(tmp_path, N_IMAGES, 4))
    both = config.model_copy(update={"cache": config.cache.model_copy(update={"enabled": True, "records": True})})
    with pytest.raises(ConfigError, match="data.cache.records=false"):
        plan_of(both).record_cache.value
    np.savez(tmp_path / "arrays.npz", x=np.zeros((4, 2)))
    arrays = config_from_dict({"data": {"source": {"type": "arrays", "path": str(tmp_path / "arrays.npz")},
                                        "cache": {"records": True}, "batch_size": 2}}).data
    with pytest.raises(ConfigError, match="data.cache.enabled=true"):
        plan_of(arrays).record_cache.value
    with pytest.raises(ConfigError, match="data.cache.enabled=true"):
        Pipeline.from_config(arrays)  # building the pipeline refuses it too


def test_later_epochs_read_no_file_and_each_is_a_full_shuffle(tmp_path):
    files = write_jpeg_shards(tmp_path, N_IMAGES, 4)
    config = images(files)
    assert plan_of(config).parse.value == "per_example"
    dataset = Pipeline.from_config(config).build()
    first, second, third = epochs(dataset, N_IMAGES // 40, 3, delete_files_after_first_epoch(files))
    assert not glob.glob(files)  # epochs 2 and 3 came from memory
    for epoch in (first, second, third):
        assert sorted(epoch) == list(range(N_IMAGES))
    # Two independent uniform permutations of n move a record (n^2 - 1) / 3n places on average
    # (40 here); replaying the cached order through a 2-element buffer would move it ~1.
    assert 0.25 * N_IMAGES < mean_move(second, third) < 0.42 * N_IMAGES
    assert 0.25 * N_IMAGES < mean_move(first, second) < 0.42 * N_IMAGES


def test_without_the_cache_a_deleted_file_is_an_error(tmp_path):
    files = write_jpeg_shards(tmp_path, N_IMAGES, 4)
    config = images(files)
    uncached = config.model_copy(update={"cache": config.cache.model_copy(update={"records": False})})
    # Read on for five epochs after the deletion: the first may have come from files the pipeline had
    # already opened, reading ahead (unlinked files stay readable; under load that took a whole epoch).
    with pytest.raises(tf.errors.NotFoundError):
        epochs(Pipeline.from_config(uncached).build(), N_IMAGES // 40, 6, delete_files_after_first_epoch(files))


def test_batch_then_parse_caches_blocks_and_reshuffles_their_windows(tmp_path):
    files, values = write_small_shards(tmp_path, 2048, 4)
    raw = small_config(files, repeat="forever", shuffle={"buffer_size": 512}, options={"deterministic": None})
    raw["source"]["record_batch"] = 16  # 128 cached blocks: a block shuffle's effect is then never left to luck
    config = config_from_dict({"data": raw}).data
    assert plan_of(config).parse.value == "batched" and plan_of(config).record_cache.value
    dataset = Pipeline.from_config(config).build()
    iterator = iter(dataset)
    seen = []
    for epoch in range(3):
        if epoch == 1:
            delete_files_after_first_epoch(files)(1)
        batches = [next(iterator) for _ in range(2048 // 64)]
        ids = np.concatenate([b["id"].numpy() for b in batches])
        rows = np.concatenate([b["features"].numpy() for b in batches])
        assert sorted(ids.tolist()) == list(range(2048))
        np.testing.assert_array_equal(rows, values[ids])  # each record parsed to its own values
        seen.append(ids.tolist())
    # Windows of 512 are drawn from a full shuffle of the 128 cached blocks, so a record moves ~683
    # places between epochs (below 546 in 1 of 10,000 simulated pairs); a fixed window allows ~170.
    assert mean_move(seen[1], seen[2]) > 400


def test_a_converted_dataset_dir_is_cached_with_its_exact_epoch(tmp_path):
    split = write_split(jpeg_examples(N_IMAGES), str(tmp_path), "train", 4)
    write_metadata(str(tmp_path), {"name": "t", "features": {"image": {"dtype": "string"}, "label": {"dtype": "int64"},
                                                             "id": {"dtype": "int64"}}, "splits": {"train": split}})
    config = images("unused").model_copy()
    source = config.source.model_copy(update={"files": None, "dir": str(tmp_path), "split": "train"})
    config = config.model_copy(update={"source": source})
    assert plan_of(config).record_cache.value
    pattern = str(tmp_path / "train-*.tfrecord")
    for epoch in epochs(Pipeline.from_config(config).build(), N_IMAGES // 40, 3, delete_files_after_first_epoch(pattern)):
        assert sorted(epoch) == list(range(N_IMAGES))


def test_doctor_proposes_the_record_cache_when_the_files_fit_but_it_is_off(tmp_path):
    config = images(write_jpeg_shards(tmp_path, N_IMAGES, 4))
    off = config.model_copy(update={"cache": config.cache.model_copy(update={"records": False})})
    proposals = [fix for finding in findings_for(off, plan_of(off), 2) for fix in finding.overrides]
    assert "data.cache.records=true" in proposals
    # never both caches (the config refuses them together): the one measured to fit
    assert "data.cache.enabled=true" not in proposals, proposals
    assert "data.cache.records=true" not in [fix for f in findings_for(config, plan_of(config), 2) for fix in f.overrides]


def test_with_the_records_cached_the_read_ceiling_limits_only_the_first_epoch():
    def rate(examples_per_sec: float) -> Measurement:
        return Measurement(examples_per_sec, 1.0, 1.0, 1e-3, 1.0, 0, 1.0, 1, 1)
    reading = Ceilings(one_thread=rate(100.0), cores=2, read=rate(150.0))
    assert reading.limit == 150.0
    cached = Ceilings(one_thread=rate(100.0), cores=2, read=rate(150.0), reads_files_every_epoch=False)
    assert cached.limit == 200.0 and cached.as_dict()["reads_files_every_epoch"] is False
