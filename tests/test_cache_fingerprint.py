"""data.cache.path: caches keyed on a fingerprint of everything upstream, and a killed writer's lockfile recovered."""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.pipeline.plan import make_plan
from tpu_pipeline.pipeline.source_factory import source_from_config
from tpu_pipeline.pipeline.stages import cache_key

from tpu_pipeline.records.writer import int_feature

pytestmark = pytest.mark.tf_builds

N_TRAIN, N_VALIDATION = 410, 102
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_split(directory, split: str, ids: range, num_shards: int = 2) -> str:
    """Shards of tiny examples: `id` and `value` (= id as a float); returns their glob."""
    os.makedirs(directory, exist_ok=True)
    writers = [tf.io.TFRecordWriter(os.path.join(directory, f"{split}-{i:05d}.tfrecord")) for i in range(num_shards)]
    for index, example_id in enumerate(ids):
        value = tf.train.Feature(float_list=tf.train.FloatList(value=[float(example_id)]))
        example = tf.train.Example(features=tf.train.Features(feature={"id": int_feature(example_id), "value": value}))
        writers[index % num_shards].write(example.SerializeToString())
    for writer in writers:
        writer.close()
    return os.path.join(str(directory), f"{split}-*.tfrecord")


def raw_config(files: str, cache_path: str, scale_max: float = 1.0, **overrides) -> dict:
    config = {
        "source": {"type": "tfrecord", "files": files, "cycle_length": 2, "deterministic": True},
        "features": {"id": {"dtype": "int64"}, "value": {"dtype": "float32"}},
        "preprocess": [
            {"op": "cast", "key": "id", "dtype": "int32"},
            {"op": "value_range", "key": "value", "min": 0.0, "max": scale_max, "in_min": 0.0, "in_max": 1000.0},
        ],
        "cache": {"enabled": True, "path": cache_path},
        "shuffle": {"enabled": False},
        "parse": "per_example",
        "batch_size": 16,
        "drop_remainder": False,
        "options": {"deterministic": True},
    }
    config.update(overrides)
    return config


def data(raw: dict):
    return config_from_dict({"data": raw}).data


def examples(raw: dict) -> dict[int, float]:
    """id → value over one epoch; fails on a duplicate id."""
    seen: dict[int, float] = {}
    for batch in Pipeline.from_config(data(raw)).build():
        for example_id, value in zip(batch["id"].numpy(), batch["value"].numpy()):
            assert int(example_id) not in seen, f"id {example_id} delivered twice"
            seen[int(example_id)] = float(value)
    return seen


def key_of(raw: dict) -> str:
    config = data(raw)
    return cache_key.fingerprint(config, make_plan(config, source_from_config(config)))


def complete_caches(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".index"))


def test_switching_files_to_another_split_never_reads_the_stale_cache(tmp_path):
    train = write_split(tmp_path / "data", "train", range(N_TRAIN))
    validation = write_split(tmp_path / "data", "validation", range(10_000, 10_000 + N_VALIDATION))
    cache = str(tmp_path / "cache")
    assert sorted(examples(raw_config(train, cache))) == list(range(N_TRAIN))
    served = examples(raw_config(validation, cache))
    assert sorted(served) == list(range(10_000, 10_000 + N_VALIDATION)), "validation must not get the train cache"
    assert len(complete_caches(cache)) == 2


def test_same_config_reuses_and_an_op_argument_makes_a_new_cache(tmp_path, caplog):
    files = write_split(tmp_path / "data", "train", range(50))
    cache = str(tmp_path / "cache")
    with caplog.at_level(logging.INFO, logger="absl"):
        first = examples(raw_config(files, cache))
        assert complete_caches(cache) == [f"pipeline0-of-1.{key_of(raw_config(files, cache))}.index"]
        again = examples(raw_config(files, cache))
    assert again == first and len(complete_caches(cache)) == 1, "the same config reads the cache it wrote"
    messages = [record.getMessage() for record in caplog.records]
    assert sum("writing a new disk cache" in m for m in messages) == 1
    assert sum("reusing the complete disk cache" in m for m in messages) == 1

    assert key_of(raw_config(files, cache, scale_max=2.0)) != key_of(raw_config(files, cache))
    doubled = examples(raw_config(files, cache, scale_max=2.0))
    assert doubled == {i: pytest.approx(2 * v) for i, v in first.items()}
    assert len(complete_caches(cache)) == 2


def test_the_key_follows_files_features_seed_and_source_but_not_speed_knobs(tmp_path):
    files = write_split(tmp_path / "data", "train", range(20))
    base = raw_config(files, str(tmp_path / "cache"))
    key = key_of(base)
    assert key_of(raw_config(files, str(tmp_path / "cache"))) == key
    assert key_of({**base, "seed": 5}) != key
    assert key_of({**base, "features": {**base["features"], "value": {"dtype": "float32", "shape": [1]}}}) != key
    assert key_of({**base, "source": {**base["source"], "sharding": "element"}}) != key
    assert key_of({**base, "source": {**base["source"], "buffer_size": 1 << 20, "num_parallel_calls": 1}}) == key
    assert key_of({**base, "augment": [{"op": "cast", "key": "value", "dtype": "bfloat16"}]}) == key, "after the cache"
    shard = sorted(tf.io.gfile.glob(files))[0]
    os.utime(shard, ns=(time.time_ns(), time.time_ns() + 10**9))  # the file changed (a rewrite)
    assert key_of(base) != key


def test_cache_path_under_a_file_is_one_line_config_error(tmp_path):
    files = write_split(tmp_path / "data", "train", range(20))
    blocker = tmp_path / "notes.txt"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError) as raised:
        Pipeline.from_config(data(raw_config(files, str(blocker / "cache"))))
    message = str(raised.value)
    assert "\n" not in message and "data.cache.path" in message and str(blocker / "cache") in message
    assert "set data.cache.path to a directory" in message
    with pytest.raises(ConfigError, match=r"^eval_data.cache.path: .* is a file, not a directory"):
        Pipeline.from_config(data(raw_config(files, str(blocker))), prefix="eval_data")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc, where nobody may create a directory")
def test_unwritable_cache_path_is_one_line_config_error(tmp_path):
    files = write_split(tmp_path / "data", "train", range(20))
    with pytest.raises(ConfigError) as raised:
        Pipeline.from_config(data(raw_config(files, "/proc/tpu-pipeline-cache")))
    message = str(raised.value)
    assert "\n" not in message and "data.cache.path" in message and "/proc/tpu-pipeline-cache" in message
    assert "is not writable" in message and "'' to cache in memory" in message


def leftovers(prefix: str, marker: dict) -> list[str]:
    """What a killed TF writer leaves (a lockfile and a temp shard), with our marker naming `marker`."""
    paths = [prefix + "_0.lockfile", prefix + "_0.data-00000-of-00001.tempstate123"]
    for path in paths:
        with open(path, "w") as handle:
            handle.write("Created at: 1")
    with open(prefix + cache_key.MARKER_SUFFIX, "w") as handle:
        json.dump(marker, handle)
    return paths


def test_a_live_writer_on_this_host_keeps_its_files(tmp_path):
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        prefix = str(tmp_path / "pipeline0-of-1.abc")
        paths = leftovers(prefix, {"host": socket.gethostname(), "pid": sleeper.pid,
                                   "start": cache_key._process_start(sleeper.pid)})
        cache_key.prepare_prefix(prefix)
        assert all(os.path.exists(path) for path in paths)
        assert json.load(open(prefix + cache_key.MARKER_SUFFIX))["pid"] == sleeper.pid, "its marker is kept"
    finally:
        sleeper.kill()
        sleeper.wait()
    cache_key.prepare_prefix(prefix)  # now it is gone: recovered
    assert not any(os.path.exists(path) for path in paths)


def test_another_hosts_writer_is_gone_only_after_its_heartbeat_stops(tmp_path):
    prefix = str(tmp_path / "pipeline0-of-1.abc")
    paths = leftovers(prefix, {"host": "some-other-host", "pid": 1, "start": None})
    alive, why = cache_key.writer_alive(prefix, paths)
    assert alive and "some-other-host" in why
    old = time.time() - cache_key.STALE_AFTER_SECONDS - 60
    for path in paths + [prefix + cache_key.MARKER_SUFFIX]:
        os.utime(path, (old, old))
    alive, why = cache_key.writer_alive(prefix, paths)
    assert not alive and "has written nothing for" in why


CHILD = """
import sys, time, json
sys.path.insert(0, {repo!r}); sys.path.insert(0, {tests!r})
from tpu_pipeline.config import config_from_dict
from tpu_pipeline.pipeline import Pipeline
iterator = iter(Pipeline.from_config(config_from_dict({{"data": json.loads(sys.argv[1])}}).data).build())
next(iterator)
print("WRITING", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_killed_writers_lockfile_is_recovered_with_a_warning(tmp_path, caplog):
    count = 3000
    files = write_split(tmp_path / "data", "train", range(count))
    raw = raw_config(files, str(tmp_path / "cache"), prefetch=0, num_parallel_calls=1, batch_size=4)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(repo=REPO, tests=os.path.join(REPO, "tests")), json.dumps(raw)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        assert child.stdout.readline().strip() == "WRITING"
        prefix = os.path.join(str(tmp_path / "cache"), f"pipeline0-of-1.{key_of(raw)}")
        assert os.path.exists(prefix + "_0.lockfile") and not os.path.exists(prefix + ".index"), "killed mid-write"
    finally:
        child.kill()  # SIGKILL: no cleanup runs
        child.wait()
    with caplog.at_level(logging.WARNING):
        served = examples(raw)
    assert sorted(served) == list(range(count)), "every example exactly once"
    warnings = [r.getMessage() for r in caplog.records if "interrupted cache write" in r.getMessage()]
    assert len(warnings) == 1 and f"process {child.pid} on this host, is gone" in warnings[0]
    assert "pipeline0-of-1." in warnings[0] and "_0.lockfile" in warnings[0]
    assert os.path.exists(prefix + ".index") and not os.path.exists(prefix + "_0.lockfile")
    assert np.allclose([served[i] for i in range(count)], np.arange(count) / 1000.0)
