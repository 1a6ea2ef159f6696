"""Property tests of balanced sharding: any number of files (of any sizes, empty ones included),
input pipelines and replicas: every epoch, each pipeline reads the same count, no example twice,
and all but the N mod n left out (which change with the epoch's file order)."""
from __future__ import annotations

import collections
import os
import tempfile

import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.records.writer import int_feature

pytestmark = pytest.mark.tf_builds

EPOCHS = 2


def write_files(directory: str, sizes: list[int]) -> str:
    next_id = 0
    for index, size in enumerate(sizes):
        with tf.io.TFRecordWriter(os.path.join(directory, f"part-{index:03d}.tfrecord")) as writer:
            for _ in range(size):
                writer.write(tf.train.Example(features=tf.train.Features(
                    feature={"id": int_feature(next_id)})).SerializeToString())
                next_id += 1
    return os.path.join(directory, "part-*.tfrecord")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 12), min_size=1, max_size=9),
    pipelines=st.integers(1, 4),
    replicas_per_pipeline=st.integers(1, 2),
    parse=st.sampled_from(["per_example", "batched"]),
    records=st.booleans(),
)
def test_every_example_at_most_once_per_epoch_and_equal_shares(sizes, pipelines, replicas_per_pipeline, parse, records):
    total = sum(sizes)
    if total < pipelines:
        return  # nothing to split: a clear error, tested elsewhere
    replicas = pipelines * replicas_per_pipeline
    with tempfile.TemporaryDirectory() as directory:
        files = write_files(directory, sizes)
        raw = {"source": {"type": "tfrecord", "files": files}, "features": {"id": {"dtype": "int64"}},
               "parse": parse, "batch_size": replicas, "drop_remainder": False, "repeat": EPOCHS,
               "shuffle": {"buffer_size": 8}, "cache": {"records": records}}
        pipeline = Pipeline.from_config(config_from_dict({"data": raw}).data)
        length = total // pipelines
        streams = []
        for index in range(pipelines):
            context = tf.distribute.InputContext(pipelines, index, replicas)
            assert pipeline.source.epoch_length(context) == length
            streams.append([int(i) for batch in pipeline.build(context) for i in batch["id"].numpy()])
    for stream in streams:
        assert len(stream) == EPOCHS * length
    for epoch in range(EPOCHS):
        seen = collections.Counter(i for stream in streams for i in stream[epoch * length:(epoch + 1) * length])
        assert max(seen.values()) == 1, f"epoch {epoch}: an example twice"
        assert len(seen) == length * pipelines and set(seen) <= set(range(total))
