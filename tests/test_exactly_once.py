"""Every example exactly once per epoch over all input pipelines, with the configs users write.

No seed, no `deterministic`, no cycle_length: the defaults, under which the stages after the
source run out of order (options.deterministic unset: out of order for a tfrecord source). Element sharding must
still read the files in one order on every pipeline, or the pipelines keep overlapping shares
and some examples are never seen. Both parse paths (per example for JPEG decoding, batch-then-
parse for small records), with and without the record cache, with file and element sharding.
"""
from __future__ import annotations

import collections
import itertools
import logging

import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.pipeline import Pipeline, choose_sharding

from helpers import plan_of, write_jpeg_shards, write_small_shards

pytestmark = pytest.mark.tf_builds

EPOCHS = 3
NUM_EXAMPLES = {"per_example": 128, "batched": 840}  # batched, 3 files: 6 blocks of up to 256 records


def write_data(directory, parse: str, num_files: int) -> str:
    if parse == "per_example":
        return write_jpeg_shards(directory, NUM_EXAMPLES[parse], num_files, size=8)
    return write_small_shards(directory, NUM_EXAMPLES[parse], num_files)[0]


def default_config(parse: str, files: str, num_pipelines: int, records: bool, repeat: int):
    """Only what the data needs: files, features, the ops, the batch, the repeat and the record cache."""
    if parse == "per_example":  # decode_image works on one example at a time
        features = {"image": {"dtype": "string"}, "id": {"dtype": "int64"}}
        ops = [{"op": "decode_image", "format": "jpeg"}, {"op": "resize", "size": 8}]
    else:  # casts work on whole batches
        features = {"features": {"dtype": "float32", "shape": [16]}, "id": {"dtype": "int64"}}
        ops = [{"op": "cast", "key": "id", "dtype": "int32"}]
    raw = {
        "source": {"type": "tfrecord", "files": files},
        "features": features,
        "preprocess": ops,
        "batch_size": 8 * num_pipelines,
        "drop_remainder": False,
        "repeat": repeat,
        "cache": {"records": records},
    }
    return config_from_dict({"data": raw}).data


def context(pipeline_id: int, num_pipelines: int) -> tf.distribute.InputContext:
    return tf.distribute.InputContext(
        num_input_pipelines=num_pipelines, input_pipeline_id=pipeline_id, num_replicas_in_sync=num_pipelines
    )


def ids_of(dataset: tf.data.Dataset) -> list[int]:
    return [int(i) for batch in dataset for i in batch["id"].numpy()]


def discrepancy(ids: list[int], num: int, times: int) -> str:
    counts = collections.Counter(ids)
    wrong = {i: counts[i] for i in range(num) if counts[i] != times}
    extra = sorted(set(counts) - set(range(num)))
    return (f"{sum(1 for c in wrong.values() if c < times)} of {num} ids seen fewer than {times} time(s), "
            f"{sum(1 for c in wrong.values() if c > times)} more often, unknown ids {extra[:5]}; "
            f"e.g. {dict(itertools.islice(wrong.items(), 8))}")


@pytest.mark.parametrize("num_files, num_pipelines, sharding", [(8, 2, "file"), (3, 4, "element")])
@pytest.mark.parametrize("records_cached", [False, True], ids=["no_record_cache", "record_cache"])
@pytest.mark.parametrize("parse", ["per_example", "batched"])
def test_every_example_once_per_epoch_over_all_input_pipelines(
    tmp_path, caplog, parse, records_cached, num_files, num_pipelines, sharding
):
    num = NUM_EXAMPLES[parse]
    files = write_data(tmp_path, parse, num_files)
    config = default_config(parse, files, num_pipelines, records_cached, repeat=EPOCHS)
    # The case is the one it claims to be.
    assert choose_sharding("auto", num_files, num_pipelines) == sharding
    assert plan_of(config).parse.value == parse
    assert plan_of(config).record_cache.value == records_cached

    pipeline = Pipeline.from_config(config)
    with caplog.at_level(logging.WARNING):
        streams = [ids_of(pipeline.build(context(i, num_pipelines))) for i in range(num_pipelines)]
    assert any("sharding by element" in r.getMessage() for r in caplog.records) == (sharding == "element")

    # The whole stream: EPOCHS times every example, over all pipelines.
    everything = list(itertools.chain(*streams))
    assert len(everything) == EPOCHS * num and sorted(set(everything)) == list(range(num)), \
        discrepancy(everything, num, EPOCHS)

    # Epoch by epoch.
    if records_cached:
        # The cache replays each pipeline's first epoch, so a pipeline's share is the same every
        # epoch: the k-th time a pipeline yields an id is in its k-th epoch, in whatever order the
        # stages after the repeat deliver them.
        epochs = [[] for _ in range(EPOCHS)]
        for stream in streams:
            seen = collections.Counter()
            for i in stream:
                assert seen[i] < EPOCHS, f"pipeline yields id {i} more than {EPOCHS} times"
                epochs[seen[i]].append(i)
                seen[i] += 1
    else:
        # Without the cache, each epoch shuffles the files anew (the same way on every pipeline),
        # so a pipeline's share changes from epoch to epoch, and the out-of-order stages after the
        # repeat blur where an epoch ends in the stream. A pass over a repeat=1 dataset is one
        # epoch exactly: the same datasets, iterated EPOCHS times.
        once = Pipeline.from_config(default_config(parse, files, num_pipelines, records_cached, repeat=1))
        datasets = [once.build(context(i, num_pipelines)) for i in range(num_pipelines)]
        epochs = [[i for dataset in datasets for i in ids_of(dataset)] for _ in range(EPOCHS)]
    for epoch, ids in enumerate(epochs, start=1):
        assert sorted(ids) == list(range(num)), f"epoch {epoch}: {discrepancy(ids, num, 1)}"
