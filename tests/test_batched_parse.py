"""Record batching and batch-then-parse must deliver exactly what per-example parsing delivers."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline import Pipeline

from helpers import plan_of, small_config, write_small_shards

pytestmark = pytest.mark.tf_builds

N = 3000


def examples(files: str, context=None, **overrides) -> dict[int, tuple]:
    config = config_from_dict({"data": small_config(files, **overrides)}).data
    seen: dict[int, tuple] = {}
    for batch in Pipeline.from_config(config).build(context):
        for row, label, example_id in zip(batch["features"].numpy(), batch["label"].numpy(), batch["id"].numpy()):
            assert int(example_id) not in seen, f"id {example_id} delivered twice"
            seen[int(example_id)] = (tuple(row.tolist()), int(label))
    return seen


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_small_shards(tmp_path_factory.mktemp("small"), N, num_shards=4)


def test_auto_picks_batch_then_parse_with_record_blocks(shards):
    files, _ = shards
    config = config_from_dict({"data": small_config(files)}).data
    assert plan_of(config).parse.value == "batched" and plan_of(config).record_block.value == 256
    with_flip = config_from_dict({"data": small_config(files, augment=[{"op": "random_flip", "key": "features"}])}).data
    assert plan_of(with_flip).parse.value == "per_example" and plan_of(with_flip).record_block.value == 0
    cached = config_from_dict({"data": small_config(files, cache={"enabled": True})}).data
    assert plan_of(cached).parse.value == "per_example"


@pytest.mark.parametrize("parse, record_batch, shuffle", [
    ("batched", 256, "auto"), ("batched", 0, "auto"), ("per_example", 64, "auto"), ("batched", 7, "window"),
    ("batched", 256, "stream"),
])
def test_same_examples_as_per_example_parsing(shards, parse, record_batch, shuffle):
    files, values = shards
    reference = examples(files, parse="per_example", source={**small_config(files)["source"], "record_batch": 0})
    assert sorted(reference) == list(range(N))
    assert all(np.allclose(reference[i][0], values[i]) and reference[i][1] == i % 3 for i in range(N))
    candidate = examples(files, parse=parse, source={**small_config(files)["source"], "record_batch": record_batch},
                         shuffle={**small_config(files)["shuffle"], "mode": shuffle})
    assert candidate == reference


def test_unshuffled_batches_are_cut_from_record_blocks_in_file_order(shards):
    files, _ = shards
    config = config_from_dict({"data": small_config(files, shuffle={"enabled": False}, source={
        **small_config(files)["source"], "shuffle_files": False})}).data
    batches = [b["id"].numpy().tolist() for b in Pipeline.from_config(config).build()]
    assert [len(b) for b in batches] == [64] * (N // 64) + [N % 64]
    # write_small_shards round-robins ids over 4 files; the interleave takes 256-record blocks in turn.
    per_file = [list(range(f, N, 4)) for f in range(4)]
    expected = [i for start in range(0, N // 4, 256) for ids in per_file for i in ids[start:start + 256]]
    assert sum(batches, []) == expected


def test_batched_pipelines_split_exactly_across_input_pipelines(shards):
    files, _ = shards
    parts = [examples(files, tf.distribute.InputContext(2, i, 2)) for i in range(2)]
    assert not set(parts[0]) & set(parts[1])
    assert sorted(set(parts[0]) | set(parts[1])) == list(range(N))


def test_batched_output_shapes_and_dtypes(shards):
    files, _ = shards
    config = config_from_dict({"data": small_config(files, drop_remainder=True, outputs={"inputs": "features", "targets": "label"})}).data
    features, labels = next(iter(Pipeline.from_config(config, target="tpu").build()))
    assert features.shape == (64, 16) and features.dtype == tf.float32
    assert labels.shape == (64,) and labels.dtype == tf.int32


def test_batched_parse_refuses_per_example_ops(shards):
    files, _ = shards
    raw = small_config(files, parse="batched", augment=[{"op": "random_flip", "key": "features"}])
    with pytest.raises(ConfigError, match=r"data.parse=batched .* data.augment\[0\] \(random_flip\)"):
        Pipeline.from_config(config_from_dict({"data": raw}).data)
