"""tf.data service with real servers started in this process: the fast twin of tests/test_service.py.

tests/test_service.py runs every server and consumer as a process of its own (as on a cluster), so
it is slow and `-m "not slow"` skips it. These tests start TensorFlow's dispatcher and two workers
in the test process itself (`service.start_dispatcher`, `start_worker`, each on a free loopback
port) and read the pipeline through them, so what the service promises for a whole pass is checked
in every run: distributed_epoch delivers every example exactly once per epoch, parallel_epochs once
per worker with each worker augmenting its own way, and one job name shared by two consumers splits
the epoch between them. Killing and restarting servers stays in the slow file: it needs processes.
"""
from __future__ import annotations

import collections
from typing import Any, Optional

import pytest
import tensorflow as tf

from helpers import data_config, write_jpeg_shards
from tpu_pipeline.config import config_from_dict
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.service.servers import start_dispatcher, start_worker

pytestmark = pytest.mark.tf_builds

NUM, SHARDS = 256, 8


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> str:
    return write_jpeg_shards(str(tmp_path_factory.mktemp("service_in_process")), NUM, SHARDS, size=8)


@pytest.fixture(scope="module")
def address():
    dispatcher = start_dispatcher(worker_timeout_ms=3000)
    workers = [start_worker(f"localhost:{dispatcher.port}") for _ in range(2)]
    yield f"grpc://localhost:{dispatcher.port}"
    for server in [*workers, dispatcher]:
        server.stop()  # every job here is a finite pass that has ended: a worker stops at once


def service_data(files: str, address: str, service: Optional[dict] = None, **overrides: Any) -> dict[str, Any]:
    data = data_config(files, **overrides)
    data["drop_remainder"] = False
    data["service"] = {"address": address, **(service or {})}
    return data


def read(data: dict[str, Any]) -> tuple[list[int], dict[int, list[float]]]:
    """The ids of the whole stream, and for each id the marks of its copies: a number a horizontal flip
    of the image changes, so two copies show whether they were augmented alike."""
    ids: list[int] = []
    marks: dict[int, list[float]] = collections.defaultdict(list)
    for batch in Pipeline.from_config(config_from_dict({"data": data}).data).build():
        image = tf.cast(batch["image"], tf.float32)
        columns = tf.cast(tf.range(tf.shape(image)[2]), tf.float32)[None, None, :, None]
        for example, mark in zip(batch["id"].numpy().tolist(), tf.reduce_sum(image * columns, axis=[1, 2, 3]).numpy()):
            ids.append(example)
            marks[example].append(round(float(mark), 2))
    return ids, marks


def test_distributed_epoch_delivers_every_example_exactly_once_per_epoch(files, address):
    ids, _ = read(service_data(files, address, repeat=2, augment=[{"op": "random_flip", "key": "image"}]))
    assert collections.Counter(ids) == {example: 2 for example in range(NUM)}


def test_parallel_epochs_delivers_each_example_once_per_worker_each_augmented_its_own_way(files, address):
    augment = [{"op": "random_flip", "key": "image"}]
    ids, marks = read(service_data(files, address, {"mode": "parallel_epochs"}, augment=augment,
                                   preprocess=data_config(files)["preprocess"][:2]))
    assert collections.Counter(ids) == {example: 2 for example in range(NUM)}
    # Both workers run one graph: without a salt of their own they would flip their n-th example alike.
    pairs = [copies for copies in marks.values() if len(copies) == 2]
    assert len(pairs) == NUM
    assert sum(first != second for first, second in pairs) > NUM // 4


def test_two_consumers_of_one_job_name_split_the_epoch_each_example_once(files, address):
    data = service_data(files, address, {"job_name": "in-process-shared"}, batch_size=8)
    streams = [iter(Pipeline.from_config(config_from_dict({"data": data}).data).build()) for _ in range(2)]
    ids: list[list[int]] = [[], []]
    ended = [False, False]
    while not all(ended):  # read in turns, as two trainer hosts do at once
        for index, stream in enumerate(streams):
            if not ended[index]:
                try:
                    ids[index].extend(next(stream)["id"].numpy().tolist())
                except StopIteration:
                    ended[index] = True
    assert not set(ids[0]) & set(ids[1])
    assert sorted(ids[0] + ids[1]) == list(range(NUM))
