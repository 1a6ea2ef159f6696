"""A bucketed stream resumed on another slice (issue 51): other replicas on one host, or other hosts; and a
packed one with other replicas on as many hosts.

Bucket mode cuts each window's buckets into groups of the global batch, one group a step; with several hosts
each reads the whole stream and keeps its replicas' batches of every group. So the groups do not depend on the
slice, only their cut into replicas' batches does: a saved place (the window, its outputs delivered) converts
to another slice as groups delivered × the new replicas (`windowed_position.regrouped_skip`). Before, one host
resumed from 8 replicas on 4 skipped twice the examples it had delivered of the window, without a word.

Each case here goes the way `train` goes: the old hosts' streams (`WindowedPosition.stream`, logged as fit takes
them) run some steps, their places are saved in a real checkpoint, a `WindowedPosition` of the new slice
restores it (`check_saved`, `resume`) and each new host reads the rest of the epoch: every example once.
"""
from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.cluster.info import ClusterInfo
from tpu_pipeline.config import config_from_dict
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.records.writer import write_split
from tpu_pipeline.train.windowed_position import POSITION_KEY, WindowedPosition, regrouped_skip

pytestmark = pytest.mark.tf_builds

EXAMPLES, GLOBAL_BATCH = 300, 16


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> str:
    return write_examples(tmp_path_factory.mktemp("bucket_slice"))


def write_examples(root, count: int = EXAMPLES) -> str:
    """Example i is i + 1 repeated 2 to 59 times (its length sets its bucket): every token says the example."""
    rng = np.random.default_rng(3)

    def example(i: int) -> bytes:
        tokens = [i + 1] * int(rng.integers(2, 60))
        feature = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens))}
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    write_split((example(i) for i in range(count)), str(root), "train", 2)
    return str(root / "train-*.tfrecord")


def pipeline(files: str, bucket_batch: str = "examples", batch: int = GLOBAL_BATCH) -> Pipeline:
    data = {"source": {"type": "tfrecord", "files": files},
            "features": {"tokens": {"dtype": "int64", "kind": "ragged"}},
            "sequence": {"keys": ["tokens"], "length": 64, "mode": "bucket", "window": 64,
                         "bucket_batch": bucket_batch},
            "batch_size": batch, "repeat": 1, "seed": 4, "shuffle": {"buffer_size": 64}}
    return Pipeline.from_config(config_from_dict({"data": data}).data)


def cluster(hosts: int, replicas: int, worker: int = 0) -> ClusterInfo:
    return ClusterInfo(strategy=None, kind="multi-worker" if hosts > 1 else "cpu", num_replicas=replicas,
                       num_hosts=hosts, devices=(), worker_id=worker)


def examples_of(batch) -> list[int]:
    features = batch[0] if isinstance(batch, tuple) else batch
    tokens, mask = features["tokens"].numpy(), features["example_mask"].numpy()
    return [int(tokens[row, 0]) for row in range(len(tokens)) if mask[row]]  # filler examples are no examples


def train_steps(files: str, hosts: int, replicas: int, steps: int, path: str, build=pipeline,
                read=examples_of) -> list[int]:
    """`steps` steps of every old host's stream as fit takes it, then a checkpoint of their places (each
    worker's own, as the position exchange leaves the chief's): the examples delivered."""
    seen, saved = [], None
    for worker in range(hosts):
        position = WindowedPosition(build(files), cluster(hosts, replicas, worker))
        context = tf.distribute.InputContext(hosts, worker, replicas)
        stream = iter(position.stream(context, 0))
        for _ in range(steps * replicas // hosts):
            seen += read(next(stream))
        position.record(steps)
        if saved is None:
            saved = position
        else:  # the chief's checkpoint holds every worker's place
            for name in ("example", "chunk", "in_window"):
                merged = getattr(saved, name).numpy()
                merged[worker] = getattr(position, name).numpy()[worker]
                getattr(saved, name).assign(merged)
    tf.train.Checkpoint(**{POSITION_KEY: saved}).write(path)
    return seen


def rest_of_epoch(files: str, hosts: int, replicas: int, steps: int, path: str, build=pipeline,
                  read=examples_of) -> tuple[list[int], str]:
    seen, line = [], ""
    for worker in range(hosts):
        position = WindowedPosition(build(files), cluster(hosts, replicas, worker))
        position.check_saved(path)
        tf.train.Checkpoint(**{POSITION_KEY: position}).read(path).assert_consumed()
        line = position.resume()
        seen += [i for batch in position.stream(tf.distribute.InputContext(hosts, worker, replicas), steps)
                 for i in read(batch)]
    return seen, line


@pytest.mark.parametrize("was, now, steps", [((1, 8), (1, 4), 3), ((1, 4), (1, 8), 5), ((2, 8), (1, 4), 3),
                                             ((1, 8), (2, 8), 2), ((2, 4), (2, 8), 6)])
def test_a_bucketed_stream_goes_on_exactly_on_another_slice(files, tmp_path, was, now, steps):
    path = str(tmp_path / "ckpt")
    before = train_steps(files, *was, steps, path)
    after, line = rest_of_epoch(files, *now, steps, path)
    counts = collections.Counter(before + after)
    assert len(before) == len(set(before)) > 0
    assert sorted(counts) == list(range(1, EXAMPLES + 1)), f"missing {EXAMPLES - len(counts)}"
    assert max(counts.values()) == 1, f"{sum(v > 1 for v in counts.values())} example(s) twice"
    assert f"the checkpoint {was[0]} host" in line and f"past its first {steps} step(s)" in line, line


def packed_rows_of(batch) -> list[int]:
    features = batch[0] if isinstance(batch, tuple) else batch
    tokens, segments = features["tokens"].numpy(), features["tokens_segment_ids"].numpy()
    return [int(row[ids == segment][0]) for row, ids in zip(tokens, segments) for segment in set(ids[ids > 0].tolist())]


@pytest.mark.parametrize("was, now", [((1, 8), (1, 4)), ((1, 4), (1, 8))])
def test_a_packed_stream_goes_on_exactly_with_other_replicas_on_as_many_hosts(files, tmp_path, was, now):
    """Pack mode's place counts rows, and a step takes the global batch's rows whatever the replicas: on as
    many hosts its places need no regrouping (on another number of hosts it is still refused)."""
    def packed(files: str) -> Pipeline:
        data = {"source": {"type": "tfrecord", "files": files},
                "features": {"tokens": {"dtype": "int64", "kind": "ragged"}},
                "sequence": {"keys": ["tokens"], "length": 64, "mode": "pack", "window": 32, "overflow": "truncate"},
                "batch_size": GLOBAL_BATCH, "repeat": 1, "seed": 4, "shuffle": {"buffer_size": 64},
                "drop_remainder": False}
        return Pipeline.from_config(config_from_dict({"data": data}).data)

    path = str(tmp_path / "ckpt")
    before = train_steps(files, *was, 3, path, packed, packed_rows_of)
    after, line = rest_of_epoch(files, *now, 3, path, packed, packed_rows_of)
    counts = collections.Counter(before + after)
    assert sorted(counts) == list(range(1, EXAMPLES + 1)) and max(counts.values()) == 1, line


def test_the_groups_delivered_decide_whatever_host_stopped_where():
    # 2 hosts x 4 replicas of 8: after 3 steps host 0 stood past output 2*8+4, host 1 past 3*8
    assert regrouped_skip([20, 24], 8, 4) == 12 and regrouped_skip([24], 8, 16) == 48 and regrouped_skip([0], 8, 4) == 0


@pytest.mark.parametrize("was, now, steps", [((1, 8), (1, 4), 3), ((2, 8), (1, 4), 2), ((1, 4), (2, 8), 5)])
def test_tokens_scaled_buckets_go_on_exactly_on_another_slice(files, tmp_path, was, now, steps):
    """Scaled by tokens, a bucket's batch rounds per replica, so a window's groups differ with the slice: the resume
    skips the examples of the window the old groups held (bucket order) and groups the rest for the new replicas."""
    path = str(tmp_path / "ckpt")
    tokens = lambda files: pipeline(files, "tokens")  # noqa: E731
    before = train_steps(files, *was, steps, path, tokens)
    after, line = rest_of_epoch(files, *now, steps, path, tokens)
    counts = collections.Counter(before + after)
    assert sorted(counts) == list(range(1, EXAMPLES + 1)), f"missing {EXAMPLES - len(counts)}"
    assert max(counts.values()) == 1, f"{sum(v > 1 for v in counts.values())} example(s) twice"
    assert f"the checkpoint {was[0]} host" in line and "of its examples the old steps' batches held" in line, line


def test_tokens_scaled_buckets_on_a_third_slice_inside_the_regrouped_window(files, tmp_path):
    """8 replicas → 4 (a step inside the window they regrouped) → 2 hosts of 8: the second change counts the
    examples the first skipped and those its groups held."""
    tokens = lambda files: pipeline(files, "tokens")  # noqa: E731
    first = train_steps(files, 1, 8, 2, str(tmp_path / "a"), tokens)
    position = WindowedPosition(tokens(files), cluster(1, 4))
    position.check_saved(str(tmp_path / "a"))
    tf.train.Checkpoint(**{POSITION_KEY: position}).read(str(tmp_path / "a")).assert_consumed()
    position.resume()
    middle = [i for batch in position.stream(tf.distribute.InputContext(1, 0, 4), 2).take(4) for i in examples_of(batch)]
    position.record(3)
    assert int(position.chunk.numpy()[0]) > 0  # inside the regrouped window: its skipped examples in the place
    tf.train.Checkpoint(**{POSITION_KEY: position}).write(str(tmp_path / "b"))
    last, line = rest_of_epoch(files, 2, 8, 3, str(tmp_path / "b"), tokens)
    counts = collections.Counter(first + middle + last)
    assert sorted(counts) == list(range(1, EXAMPLES + 1)) and max(counts.values()) == 1, line


@pytest.mark.parametrize("bucket_batch", ["examples", "tokens"])
def test_a_bucketed_stream_goes_on_exactly_with_another_global_batch(files, tmp_path, bucket_batch):
    """A global batch of 16 on 8 replicas, then 8 on 4 (`train.allow_changes=[data.batch_size]`: the step rebased by
    `batch_change`, which tells the position the old batch): the window goes on past the examples the old batch's
    groups held, grouped by the new one; every example once."""
    path = str(tmp_path / "ckpt")
    before = train_steps(files, 1, 8, 3, path, lambda files: pipeline(files, bucket_batch, 16))
    position = WindowedPosition(pipeline(files, bucket_batch, 8), cluster(1, 4))
    position.check_saved(path)
    tf.train.Checkpoint(**{POSITION_KEY: position}).read(path).assert_consumed()
    position.rebase(3, 6, 16)
    line = position.resume()
    after = [i for batch in position.stream(tf.distribute.InputContext(1, 0, 4), 6) for i in examples_of(batch)]
    counts = collections.Counter(before + after)
    assert sorted(counts) == list(range(1, EXAMPLES + 1)) and max(counts.values()) == 1, line
    assert "of its examples the old steps' batches held" in line, line
