"""The multi-worker agreements of `train`, one process per simulated worker replaced by threads over
an in-memory key-value store with the coordination service's semantics (set once, blocking get).
The real service, with real worker processes, is exercised by tests/test_multiworker.py (slow)."""
from __future__ import annotations

import threading
from typing import Optional

import pytest
import tensorflow as tf

from tpu_pipeline.cluster import ClusterInfo
from tpu_pipeline.cluster.coordination import StoreUnavailable
from tpu_pipeline.cluster.resolver import worker_id
from tpu_pipeline.errors import ClusterError
from tpu_pipeline.train.preemption import Preempted, PreemptionFlag, StopAgreement
from tpu_pipeline.train.run_files import check_same_restore

pytestmark = pytest.mark.tf_builds


class MemoryStore:
    """The coordination service's key-value contract: a key is set once; get waits for it (and JAX's
    store's put and peek)."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.changed = threading.Condition()

    def set(self, key: str, value: str) -> bool:
        with self.changed:
            if key in self.values:
                return False
            self.values[key] = value
            self.changed.notify_all()
            return True

    def get(self, key: str, timeout_seconds: Optional[float] = None) -> Optional[str]:
        with self.changed:
            self.changed.wait_for(lambda: key in self.values, timeout=timeout_seconds or 10)
            return self.values.get(key)

    def put(self, key: str, value: str) -> None:
        """JAX's store also sets over a value (a process's beat: tests/test_peer_watch.py)."""
        with self.changed:
            self.values[key] = value
            self.changed.notify_all()

    def peek(self, key: str) -> Optional[str]:
        with self.changed:
            return self.values.get(key)


def run_workers(store: MemoryStore, sigterm_at: dict[int, int], num_workers: int = 3, steps: int = 50) -> dict[int, int]:
    """Workers in lockstep (a barrier per step, as an all-reduce is); returns where each stopped."""
    barrier = threading.Barrier(num_workers, timeout=10)
    stopped: dict[int, int] = {}

    def worker(index: int) -> None:
        flag = PreemptionFlag(StopAgreement(store, index, num_workers, "run0"))
        for step in range(1, steps + 1):
            barrier.wait()  # the step's collective
            if sigterm_at.get(index) == step:
                flag.requested = True
            if flag.stop_now(step):
                stopped[index] = step
                break
        flag.__exit__(None, None, None)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(num_workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    return stopped


def test_one_workers_sigterm_stops_every_worker_at_the_next_step():
    stopped = run_workers(MemoryStore(), {2: 7})
    assert stopped == {0: 8, 1: 8, 2: 8}


def test_sigterms_on_several_workers_at_once_still_agree_on_one_step():
    stopped = run_workers(MemoryStore(), {0: 5, 1: 5, 2: 6})
    assert len(set(stopped.values())) == 1 and len(stopped) == 3 and stopped[0] == 6


def test_without_sigterm_no_worker_stops_and_closing_releases_the_watchers():
    store = MemoryStore()
    assert run_workers(store, {}) == {}
    assert store.values["tpu_pipeline/run0/stop_at_step"] == "done"


def test_worker_0_hosts_the_store_so_it_waits_until_a_late_peer_has_closed():
    # CI once failed a finished two-worker run: the chief exited, taking the coordination service
    # with it, while worker 1 was still about to release its watcher.
    store = MemoryStore()
    host = StopAgreement(store, 0, 2, "run0")
    host_closed = threading.Event()
    closing = threading.Thread(target=lambda: (host.close(), host_closed.set()))
    closing.start()
    assert not host_closed.wait(0.3)  # still waiting for worker 1
    StopAgreement(store, 1, 2, "run0").close()
    assert host_closed.wait(5)
    closing.join()


class WatchedStore(MemoryStore):
    """Records whose "closed" key a worker waited for."""

    def __init__(self) -> None:
        super().__init__()
        self.awaited: list[str] = []

    def get(self, key: str, timeout_seconds: Optional[float] = None) -> Optional[str]:
        if "/closed/" in key:
            self.awaited.append(key)
        return super().get(key, timeout_seconds)


@pytest.mark.parametrize("ending, waits", [(None, True), (Preempted, True), (tf.errors.UnavailableError, False),
                                           (KeyboardInterrupt, False)])
def test_worker_0_waits_for_its_peers_only_when_training_did_not_fail(ending, waits):
    """A peer SIGKILLed mid-run never closes: worker 0, failing on its collective, waited the whole
    _CLOSE_WAIT_SECONDS (60 s) before its "start every worker again" (two-worker tests spent a minute there)."""
    store = WatchedStore()
    store.set("tpu_pipeline/run0/stop_at_step/closed/1", "1")  # the clean cases' peer, closed already
    PreemptionFlag(StopAgreement(store, 0, 2, "run0")).__exit__(ending, None, None)
    assert store.awaited == (["tpu_pipeline/run0/stop_at_step/closed/1"] if waits else [])


class GoneStore(MemoryStore):
    """The store after its host process exited."""

    def set(self, key: str, value: str) -> bool:
        raise StoreUnavailable("failed to connect to all addresses")

    def get(self, key: str, timeout_seconds: Optional[float] = None) -> Optional[str]:
        raise StoreUnavailable("failed to connect to all addresses")


def test_a_peer_that_finds_the_host_gone_at_the_end_still_finishes_cleanly():
    flag = PreemptionFlag(StopAgreement(GoneStore(), 1, 2, "run0"))
    flag.agreement._watcher.join(timeout=5)
    assert not flag.agreement._watcher.is_alive()
    flag.__exit__(None, None, None)  # no error: the run was over


def test_one_process_stops_at_the_step_it_got_sigterm():
    flag = PreemptionFlag()
    assert not flag.stop_now(3)
    flag.requested = True
    assert flag.stop_now(4)


def multi_worker_info(index: int, num: int = 2) -> ClusterInfo:
    return ClusterInfo(strategy=tf.distribute.get_strategy(), kind="multi-worker", num_replicas=num, num_hosts=num,
                       devices=("CPU:0",), worker_id=index, is_chief=index == 0)


def test_workers_that_found_different_checkpoints_are_told_the_run_dir_must_be_shared():
    store = MemoryStore()
    errors = []

    def worker(index: int, found: Optional[str]) -> None:
        try:
            check_same_restore(store, multi_worker_info(index), "run0", found)
        except ClusterError as error:
            errors.append(str(error))

    threads = [threading.Thread(target=worker, args=(0, "/runs/a/checkpoints/ckpt-40")),
               threading.Thread(target=worker, args=(1, None))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert len(errors) == 2
    assert "worker 0: /runs/a/checkpoints/ckpt-40; worker 1: no checkpoint" in errors[0]
    assert "shared directory (e.g. gs://bucket/run)" in errors[0]


def test_workers_that_found_the_same_checkpoint_go_on():
    store = MemoryStore()
    for index in (0, 1):
        store.set(f"tpu_pipeline/run0/restored/{index}", "/runs/a/checkpoints/ckpt-40")
    check_same_restore(store, multi_worker_info(1), "run0", "/runs/a/checkpoints/ckpt-40")


@pytest.mark.parametrize("tf_config, expected", [
    ({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}, 1),
    ({"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}, 0),
    ({"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}, 1),
])
def test_worker_ids_count_the_chief_first(tf_config, expected):
    assert worker_id(tf_config) == expected


def test_checkpoint_every_seconds_is_refused_with_several_workers(tmp_path):
    from tpu_pipeline.config import config_from_dict
    from tpu_pipeline.errors import ConfigError
    from tpu_pipeline.train import train

    config = config_from_dict({"data": {"source": {"type": "tfrecord", "files": str(tmp_path / "*.tfrecord")},
                                        "features": {"x": {"dtype": "int64"}}, "batch_size": 8},
                               "train": {"checkpoint_every_seconds": 60, "run_dir": str(tmp_path / "run")}})
    with pytest.raises(ConfigError, match="train.checkpoint_every_seconds: .* use train.checkpoint_every_steps"):
        train(config, cluster=multi_worker_info(0), printer=lambda line: None)
