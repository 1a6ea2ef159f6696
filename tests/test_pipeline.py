"""The pipeline on real TFRecords of real JPEGs, under a real 8-replica CPU strategy."""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import ConfigError, TpuCompatibilityError
from tpu_pipeline.pipeline import Pipeline, choose_sharding
from tpu_pipeline.pipeline.checks.tpu_check import TPU_DTYPES, tpu_problems

from helpers import data_config, jpeg_examples, write_jpeg_shards

pytestmark = pytest.mark.tf_builds


def pipeline_for(files: str, target: str = "cpu", **overrides) -> Pipeline:
    config = config_from_dict({"data": data_config(files, **overrides)}).data
    return Pipeline.from_config(config, target=target)


def ids_of(dataset: tf.data.Dataset) -> list[int]:
    return [int(i) for batch in dataset for i in batch["id"].numpy()]


def test_per_replica_batches_have_the_right_shapes(tmp_path, eight_replica_strategy):
    files = write_jpeg_shards(tmp_path, num=256, num_shards=8)
    pipeline = pipeline_for(files, target="tpu")  # also runs the TPU check: must pass
    distributed = pipeline.distribute(eight_replica_strategy)
    batch = next(iter(distributed))
    images = eight_replica_strategy.experimental_local_results(batch["image"])
    labels = eight_replica_strategy.experimental_local_results(batch["label"])
    assert len(images) == 8
    assert {tuple(t.shape) for t in images} == {(4, 16, 16, 3)}  # global 32 / 8 replicas
    assert {t.dtype for t in images} == {tf.bfloat16}
    assert {tuple(t.shape) for t in labels} == {(4,)}
    assert {t.dtype for t in labels} == {tf.int32}


def test_eight_replicas_see_every_example_exactly_once(tmp_path, eight_replica_strategy):
    files = write_jpeg_shards(tmp_path, num=256, num_shards=8)
    distributed = pipeline_for(files).distribute(eight_replica_strategy)
    seen = []
    for batch in distributed:
        for ids in eight_replica_strategy.experimental_local_results(batch["id"]):
            seen.extend(int(i) for i in ids.numpy())
    assert sorted(seen) == list(range(256))


@pytest.mark.parametrize(
    "num_files, requested, expected_mode",
    [(8, "file", "file"), (1, "element", "element"), (8, "auto", "balanced"), (1, "auto", "balanced")],
)
def test_two_input_pipelines_split_one_epoch_exactly(tmp_path, caplog, num_files, requested, expected_mode):
    num = 240 if num_files == 1 else 256
    files = write_jpeg_shards(tmp_path, num=num, num_shards=num_files)
    assert choose_sharding(requested, num_files, 2, balanced=True) == expected_mode
    source = {"type": "tfrecord", "files": files, "cycle_length": 4, "sharding": requested}
    pipeline = pipeline_for(files, source=source)
    per_pipeline = []
    with caplog.at_level(logging.WARNING):
        for pipeline_id in range(2):
            context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline_id, num_replicas_in_sync=8)
            dataset = pipeline.build(context)
            assert dataset.element_spec["image"].shape.as_list() == [4, 16, 16, 3]
            per_pipeline.append(ids_of(dataset))
    assert not set(per_pipeline[0]) & set(per_pipeline[1]), "input pipelines overlapped"
    assert sorted(per_pipeline[0] + per_pipeline[1]) == list(range(num))
    assert len(per_pipeline[0]) == len(per_pipeline[1]) == num // 2
    assert not any("sharding by element" in r.getMessage() for r in caplog.records), "auto is balanced now"


def write_unequal_files(directory, sizes: list[int]) -> tuple[str, dict[str, set[int]]]:
    """One file per size, of consecutive ids; returns their glob and each file's ids."""
    records = list(jpeg_examples(sum(sizes)))
    by_file, start = {}, 0
    for index, size in enumerate(sizes):
        path = os.path.join(str(directory), f"train-{index:05d}-of-{len(sizes):05d}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for record in records[start:start + size]:
                writer.write(record)
        by_file[path], start = set(range(start, start + size)), start + size
    return os.path.join(str(directory), "train-*.tfrecord"), by_file


def test_file_sharding_is_by_file(tmp_path):
    """With file sharding, each pipeline reads whole files, and never opens the other pipeline's.

    The files differ in size, so element sharding (every pipeline reads every file and keeps every
    n-th record) could not give the same split.
    """
    sizes = [2, 4, 6, 8, 10, 12, 14, 16]
    files, by_file = write_unequal_files(tmp_path, sizes)
    pipeline = pipeline_for(files, drop_remainder=False, source={"type": "tfrecord", "files": files, "sharding": "file"})
    owned = []
    for pipeline_id in range(2):
        ids = ids_of(pipeline.build(tf.distribute.InputContext(2, pipeline_id, 2)))
        assert len(ids) == len(set(ids))
        whole = {path for path, file_ids in by_file.items() if file_ids <= set(ids)}
        partly = {path for path, file_ids in by_file.items() if file_ids & set(ids)} - whole
        assert not partly, f"pipeline {pipeline_id} read part of {sorted(os.path.basename(p) for p in partly)}"
        assert len(whole) == 4 and sorted(ids) == sorted(set().union(*(by_file[p] for p in whole)))
        owned.append(whole)
    assert not owned[0] & owned[1] and len(owned[0] | owned[1]) == 8

    # The same pipeline built again reads the same files (same file seed) without the others on disk.
    dataset = pipeline.build(tf.distribute.InputContext(2, 0, 2))
    for path in owned[1]:
        os.remove(path)
    assert sorted(ids_of(dataset)) == sorted(set().union(*(by_file[p] for p in owned[0])))


def test_balanced_sharding_gives_every_pipeline_the_same_count_from_unequal_files(tmp_path, caplog):
    """Files of 1..16 records (73 in all) over 3 pipelines: each reads 73 // 3 = 24 in every epoch,
    none overlap, and the one record left over is another one each epoch (the file order's last)."""
    sizes = [2, 4, 6, 8, 10, 12, 14, 16, 1]  # 73 records: one is left out of each epoch, with a log line
    files, _ = write_unequal_files(tmp_path, sizes)
    config = data_config(files, drop_remainder=False, repeat=3, batch_size=3, shuffle={"enabled": False},
                         source={"type": "tfrecord", "files": files, "cycle_length": 4})
    pipeline = Pipeline.from_config(config_from_dict({"data": config}).data)
    with caplog.at_level(logging.WARNING):
        streams = [ids_of(pipeline.build(tf.distribute.InputContext(3, index, 3))) for index in range(3)]
    assert any("1 of 73 records are left out of each epoch" in r.getMessage() for r in caplog.records)
    left_out = []
    for epoch in range(3):
        parts = [stream[epoch * 24:(epoch + 1) * 24] for stream in streams]
        assert all(len(part) == 24 for part in parts)
        seen = sorted(i for part in parts for i in part)
        assert len(set(seen)) == 72, f"epoch {epoch}: pipelines overlap"
        left_out.append(set(range(73)) - set(seen))
    assert all(len(missing) == 1 for missing in left_out)
    assert len(set().union(*left_out)) > 1, "the record left out should change with the epoch's file order"


def test_deterministic_mode_repeats_the_same_order(tmp_path):
    files = write_jpeg_shards(tmp_path, num=128, num_shards=4)
    first = ids_of(pipeline_for(files).build())
    second = ids_of(pipeline_for(files).build())
    assert first == second
    assert first != sorted(first), "the seeded shuffle should change the order"
    other_seed = ids_of(pipeline_for(files, seed=2).build())
    assert other_seed != first and sorted(other_seed) == sorted(first)


def test_gzip_shards_read_back_the_same_examples(tmp_path):
    files = write_jpeg_shards(tmp_path, num=64, num_shards=2, compression="GZIP")
    config = data_config(files)
    config["source"]["compression"] = "GZIP"
    pipeline = Pipeline.from_config(config_from_dict({"data": config}).data)
    assert sorted(ids_of(pipeline.build())) == list(range(64))


def test_repeat_count_and_remainder(tmp_path):
    files = write_jpeg_shards(tmp_path, num=100, num_shards=2)
    twice = ids_of(pipeline_for(files, repeat=2).build())
    assert len(twice) == 192  # 200 examples → 6 full batches of 32, the last 8 dropped
    keep_all = pipeline_for(files, drop_remainder=False).build()
    assert sorted(ids_of(keep_all)) == list(range(100))


def test_tpu_check_rejects_a_dynamic_batch_dimension(tmp_path):
    files = write_jpeg_shards(tmp_path, num=64, num_shards=2)
    with pytest.raises(TpuCompatibilityError) as error:
        pipeline_for(files, target="tpu", drop_remainder=False).build()
    message = str(error.value)
    assert "feature 'image'" in message and "(None, 16, 16, 3)" in message
    assert "drop_remainder" in message


def test_tpu_check_rejects_strings_and_int64(tmp_path):
    files = write_jpeg_shards(tmp_path, num=64, num_shards=2)
    with pytest.raises(TpuCompatibilityError) as error:
        pipeline_for(files, target="tpu", preprocess=[]).build()
    message = str(error.value)
    assert "feature 'image' has dtype string" in message and "op keep" in message
    assert "feature 'id' has dtype int64" in message and "int32" in message
    # The same dataset is fine on CPU: the check is for TPUs only, but callable anywhere.
    assert pipeline_for(files, preprocess=[]).build().element_spec["image"].dtype == tf.string


def test_tpu_check_looks_inside_keras_tuples(tmp_path):
    """Training always builds (inputs, targets) tuples: the check must inspect both of their parts."""
    files = write_jpeg_shards(tmp_path, num=64, num_shards=2)
    outputs = {"inputs": "image", "targets": "label"}

    with pytest.raises(TpuCompatibilityError) as error:
        pipeline_for(files, target="tpu", outputs=outputs, drop_remainder=False).build()
    message = str(error.value)
    assert "feature 'inputs' has dynamic shape (None, 16, 16, 3)" in message, message
    assert "feature 'targets' has dynamic shape (None,)" in message, message
    assert "drop_remainder" in message

    with pytest.raises(TpuCompatibilityError) as error:
        pipeline_for(files, target="tpu", outputs=outputs, preprocess=[]).build()
    message = str(error.value)
    assert "feature 'inputs' has dtype string" in message and "op keep" in message, message
    assert "feature 'targets' has dtype int64" in message and "{op: cast, key: label, dtype: int32}" in message, message
    # The suggested op, added as written, is the fix (it names the feature, not the tuple position).
    fixed = data_config(files)["preprocess"] + [{"op": "cast", "key": "label", "dtype": "int32"}]
    pipeline_for(files, target="tpu", outputs=outputs, preprocess=[op for op in fixed if op.get("key") != "id"]).build()

    # A dict of features as the inputs part of the tuple: its keys are checked too.
    preprocess = [op for op in data_config(files)["preprocess"] if op.get("key") != "id"]
    with pytest.raises(TpuCompatibilityError) as error:
        pipeline_for(files, target="tpu", outputs={"inputs": ["image", "id"], "targets": "label"},
                     preprocess=preprocess).build()
    message = str(error.value)
    assert "feature 'inputs.id' has dtype int64" in message, message
    assert "inputs.image" not in message and "targets" not in message, message

    # The same tuples, fit for a TPU, pass; on CPU the unfit ones build as they are.
    spec = pipeline_for(files, target="tpu", outputs=outputs).build().element_spec
    assert isinstance(spec, tuple) and spec[0].shape.as_list() == [32, 16, 16, 3]
    images, labels = pipeline_for(files, outputs=outputs, preprocess=[]).build().element_spec
    assert (images.dtype, labels.dtype) == (tf.string, tf.int64)


@pytest.mark.parametrize("dtype", [tf.float64, tf.int64, tf.string, tf.float16, tf.int16, tf.uint16, tf.complex128],
                         ids=lambda dtype: dtype.name)
def test_tpu_check_refuses_every_dtype_a_tpu_does_not_take(dtype):
    """float64 (as common as int64: NumPy's default) must be refused too, not only the dtypes other tests plant."""
    problems = tpu_problems({"x": tf.TensorSpec([8, 4], dtype), "ok": tf.TensorSpec([8], tf.float32)})
    assert len(problems) == 1 and problems[0].startswith(f"feature 'x' has dtype {dtype.name} (shape (8, 4)):"), problems


@pytest.mark.parametrize("dtype", sorted(TPU_DTYPES, key=lambda d: d.name), ids=lambda dtype: dtype.name)
def test_tpu_check_accepts_the_dtypes_a_tpu_takes(dtype):
    assert tpu_problems({"x": tf.TensorSpec([8, 4], dtype)}) == []


def test_tpu_check_refuses_float64_from_a_pipeline_and_names_the_cast(tmp_path):
    files = write_jpeg_shards(tmp_path, num=64, num_shards=2)
    preprocess = data_config(files)["preprocess"] + [{"op": "cast", "key": "image", "dtype": "float64"}]
    with pytest.raises(TpuCompatibilityError) as error:
        pipeline_for(files, target="tpu", preprocess=preprocess).build()
    message = str(error.value)
    assert "feature 'image' has dtype float64 (shape (32, 16, 16, 3))" in message, message
    assert "{op: cast, key: image, dtype: float32}" in message, message


@pytest.mark.parametrize("shape, dynamic", [
    ([32, None, None, 3], "(32, None, None, 3)"),  # images of their own size: no resize
    ([32, 16, 16, None], "(32, 16, 16, None)"),
    ([32, None], "(32, None)"),  # a variable-length feature
    (None, "<unknown>"),  # unknown rank
], ids=["image_sizes", "channels", "length", "rank"])
def test_tpu_check_looks_at_every_dimension_not_only_the_batch(shape, dynamic):
    """A static batch hides nothing: any dynamic dimension is one XLA compile per shape."""
    problems = tpu_problems({"image": tf.TensorSpec(shape, tf.float32)})
    assert len(problems) == 1, problems
    assert f"feature 'image' has dynamic shape {dynamic}" in problems[0], problems
    if shape is not None:
        assert "give it a fixed size" in problems[0] and "drop_remainder" not in problems[0], problems


def test_tpu_check_refuses_images_left_at_their_own_size(tmp_path):
    """Decoded JPEGs of varying sizes without a resize: a [32, None, None, 3] batch spec (static batch)."""
    files = write_jpeg_shards(tmp_path, num=64, num_shards=2)
    preprocess = [op for op in data_config(files)["preprocess"] if op["op"] != "resize"]
    with pytest.raises(TpuCompatibilityError) as error:
        pipeline_for(files, target="tpu", preprocess=preprocess).build()
    message = str(error.value)
    assert "feature 'image' has dynamic shape (32, None, None, 3)" in message, message
    assert "op resize" in message, message


def test_outputs_give_keras_tuples(tmp_path):
    files = write_jpeg_shards(tmp_path, num=64, num_shards=2)
    dataset = pipeline_for(files, target="tpu", outputs={"inputs": "image", "targets": "label"}).build()
    images, labels = next(iter(dataset))
    assert images.shape == (32, 16, 16, 3) and labels.shape == (32,)


def test_cache_then_augment_flips_differently_each_epoch(tmp_path):
    files = write_jpeg_shards(tmp_path, num=32, num_shards=1)
    config = data_config(
        files,
        preprocess=[{"op": "decode_image"}, {"op": "resize", "size": 16}, {"op": "cast", "key": "id", "dtype": "int32"}],
        cache={"enabled": True, "path": str(tmp_path / "cache")},
        augment=[{"op": "random_flip"}],
        shuffle={"enabled": False},
        repeat=2,
        seed=7,
    )
    pipeline = Pipeline.from_config(config_from_dict({"data": config}).data)
    batches = [b["image"].numpy() for b in pipeline.build()]
    assert len(batches) == 2  # one batch of 32 per epoch
    flipped = np.all(batches[0] == batches[1][:, :, ::-1], axis=(1, 2, 3))
    same = np.all(batches[0] == batches[1], axis=(1, 2, 3))
    assert np.all(flipped | same) and flipped.any() and same.any()
    assert any(p.name.startswith("pipeline0-of-1") for p in (tmp_path / "cache").iterdir())
    again = [b["image"].numpy() for b in Pipeline.from_config(config_from_dict({"data": config}).data).build()]
    assert all(np.array_equal(a, b) for a, b in zip(batches, again)), "a fixed seed must reproduce the flips"


def test_batch_not_divisible_by_replicas_names_the_key(tmp_path):
    files = write_jpeg_shards(tmp_path, num=64, num_shards=2)
    with pytest.raises(ConfigError, match=r"data\.batch_size=36 .* 8 replicas.*32 or 40"):
        pipeline_for(files, batch_size=36).build(tf.distribute.InputContext(1, 0, 8))


def test_order_is_its_own_key_never_a_side_effect_of_a_seed(tmp_path):
    files = write_jpeg_shards(tmp_path, num=16, num_shards=2)

    def ordered(**changes) -> bool:
        raw = data_config(files)
        raw["options"] = {}
        raw.pop("seed", None)
        for key, value in changes.items():
            section, _, name = key.partition("__")
            raw[section] = {**raw.get(section, {}), name: value} if name else value
        return Pipeline.from_config(config_from_dict({"data": raw}).data).build().options().deterministic

    assert ordered() is True  # in order by default: a resume is exact
    assert ordered(seed=1) is True  # a seed fixes the draws, not the order
    assert ordered(options__deterministic=False) is False
    assert ordered(seed=1, options__deterministic=False) is False
