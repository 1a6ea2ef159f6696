"""The multi-host input position of a packed stream (`WindowedPosition`), with a fake key-value store.

On several TF_CONFIG workers only the chief's checkpoint is kept, so before each save every worker
publishes where its own input stands and takes everyone's. What must hold, whatever the position is
made of: the chief's checkpoint alone puts every worker's stream back exactly where it stopped; a peer
that never publishes, or a store that is gone, is a one-line ClusterError, not a hang. Two workers
run here as two threads of one process around a dict (tests/test_multiworker_sequences.py runs real
processes, slowly).
"""
from __future__ import annotations

import threading
from typing import Optional

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.cluster import ClusterInfo
from tpu_pipeline.cluster.coordination import StoreUnavailable
from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import ClusterError
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.train import windowed_position
from tpu_pipeline.train.windowed_position import WindowedPosition

from test_text_lm import converted, lm_config

pytestmark = pytest.mark.tf_builds

WORKERS = 2
STEP = 5  # the step both workers save at (one element per step each: one replica per worker)


class FakeStore:
    """The coordination service's key-value store: set once, get waits for the key (None after the timeout)."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.gone = False
        self._changed = threading.Condition()

    def set(self, key: str, value: str) -> bool:
        if self.gone:
            raise StoreUnavailable("the chief is gone")
        with self._changed:
            if key in self.values:
                return False
            self.values[key] = value
            self._changed.notify_all()
            return True

    def get(self, key: str, timeout_seconds: Optional[float] = None) -> Optional[str]:
        if self.gone:
            raise StoreUnavailable("the chief is gone")
        with self._changed:
            self._changed.wait_for(lambda: key in self.values, timeout=timeout_seconds)
            return self.values.get(key)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Pipeline:
    tmp_path = tmp_path_factory.mktemp("windowed_position")
    raw = lm_config(converted(tmp_path, count=200, splits="train"), str(tmp_path / "run"), eval_data=False)
    raw["data"]["sequence"]["window"] = 16  # windows of 16 documents: 9 elements cross several
    raw["data"]["shuffle"] = {"buffer_size": 32}
    return Pipeline.from_config(config_from_dict(raw).data)


def _worker(worker: int) -> ClusterInfo:
    return ClusterInfo(strategy=tf.distribute.get_strategy(), kind="multi-worker", num_replicas=WORKERS,
                       num_hosts=WORKERS, devices=("/CPU:0",), worker_id=worker, is_chief=worker == 0)


def _context(worker: int) -> tf.distribute.InputContext:
    return tf.distribute.InputContext(WORKERS, worker, WORKERS)


def _tokens(dataset: tf.data.Dataset, count: int) -> list[np.ndarray]:
    return [inputs["inputs"] for inputs, _, _ in dataset.take(count).as_numpy_iterator()]


def _run_to_step(pipeline: Pipeline, store: FakeStore) -> tuple[list[WindowedPosition], list[list[np.ndarray]]]:
    """Each worker takes STEP + 4 elements of its stream (a consumer runs ahead of its step), then both
    record STEP at once, as before a save: (the positions, the elements each worker's stream gave)."""
    positions = [WindowedPosition(pipeline, _worker(w), store, run_key="test") for w in range(WORKERS)]
    streams = [_tokens(position.stream(_context(worker), 0), STEP + 4) for worker, position in enumerate(positions)]
    errors: list[BaseException] = []

    def record(position: WindowedPosition) -> None:
        try:
            position.record(STEP)
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            errors.append(error)

    threads = [threading.Thread(target=record, args=(position,)) for position in positions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    return positions, streams


def test_the_chiefs_checkpoint_alone_resumes_every_workers_stream_exactly(pipeline, tmp_path):
    positions, streams = _run_to_step(pipeline, FakeStore())
    saved = tf.train.Checkpoint(data=positions[0]).save(str(tmp_path / "chief" / "ckpt"))  # only the chief's is kept

    for worker, uninterrupted in enumerate(streams):
        resumed = WindowedPosition(pipeline, _worker(worker), FakeStore(), run_key="test")
        tf.train.Checkpoint(data=resumed).restore(saved).assert_existing_objects_matched()
        again = _tokens(resumed.stream(_context(worker), STEP), 4)
        assert not np.array_equal(uninterrupted[0], uninterrupted[STEP])  # the place matters
        for got, expected in zip(again, uninterrupted[STEP:], strict=True):
            np.testing.assert_array_equal(got, expected, err_msg=f"worker {worker} resumed elsewhere")
    assert streams[0][0].shape == streams[1][0].shape and not np.array_equal(streams[0][0], streams[1][0])


def test_a_peer_that_publishes_nothing_is_one_line_naming_it(pipeline, monkeypatch):
    monkeypatch.setattr(windowed_position, "POSITION_WAIT_SECONDS", 0.2)
    alone = WindowedPosition(pipeline, _worker(0), FakeStore(), run_key="test")
    with pytest.raises(ClusterError, match=r"^worker 1 published no input position for the checkpoint of step 0 .*"
                                           r"start every worker again") as error:
        alone.record(0)
    assert "\n" not in str(error.value)


def test_a_store_that_is_gone_is_one_line(pipeline):
    store = FakeStore()
    position = WindowedPosition(pipeline, _worker(1), store, run_key="test")
    store.gone = True
    with pytest.raises(ClusterError, match=r"^the workers could not exchange their input positions for the checkpoint "
                                           r"of step 0 \(the chief is gone\); start every worker again"):
        position.record(0)
