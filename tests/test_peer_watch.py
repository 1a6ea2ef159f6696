"""PeerWatch (train/peer_watch.py): on JAX, a peer whose beats stop ends this process with the PeerFailure
line; a peer that said it is done, or has not started yet, does not. The store is an in-memory one with the
two calls the watch makes of jax.distributed's (tests/test_jax_multiprocess.py runs it on the real one: a
host SIGKILLed at an epoch's end)."""
from __future__ import annotations

import threading
import time
from typing import Optional

import pytest

from test_stop_agreement import MemoryStore
from tpu_pipeline.train.peer_watch import DONE, PeerWatch

pytestmark = pytest.mark.tf_independent


def watch(store: MemoryStore, exits: list, me: int = 0) -> PeerWatch:
    return PeerWatch(store, me, 3, "run0", lambda: "/runs/a/checkpoints/ckpt-8", beat_seconds=0.02,
                     silent_seconds=0.3, exit=exits.append)


def beat(store: MemoryStore, worker: int, seconds: float) -> None:
    end, count = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        count += 1
        store.put(f"tpu_pipeline/run0/beat/{worker}", str(count))
        time.sleep(0.02)


def test_a_peer_whose_beats_stop_ends_this_process_with_one_line(capfd):
    store, exits = MemoryStore(), []
    with watch(store, exits):
        beat(store, 1, 0.2)
        store.put("tpu_pipeline/run0/beat/2", DONE)  # worker 2 finished: not a death
        beat(store, 1, 0.2)  # worker 1 dies now
        deadline = time.monotonic() + 10
        while not exits and time.monotonic() < deadline:
            time.sleep(0.05)
    assert exits == [2]
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tpu-pipeline train: error: a peer worker stopped or cannot be "
                                                   "reached (worker 1 has not been heard from for")
    assert lines[0].endswith("start every worker again with the same command: the run resumes from "
                             "/runs/a/checkpoints/ckpt-8")
    assert store.peek("tpu_pipeline/run0/beat/0") == DONE  # what this process's peers read of it


def test_peers_that_beat_finish_or_have_not_started_are_left_alone():
    store, exits = MemoryStore(), []
    with watch(store, exits):
        beat(store, 1, 1.0)  # worker 2 never beats (a slower start-up): JAX's to end if it never comes
        store.put("tpu_pipeline/run0/beat/1", DONE)
        time.sleep(0.6)
    assert exits == []


class BeatsWhenRead(MemoryStore):
    """Worker 1 has no beat until `started` is set, and from then on a new one at every read: its beats never go
    stale, however the threads are scheduled, so only when its silence is counted from can end this process."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.beats = 0

    def peek(self, key: str) -> Optional[str]:
        if key == "tpu_pipeline/run0/beat/1" and self.started.is_set():
            self.beats += 1
            self.put(key, str(self.beats))
        return super().peek(key)


def test_a_peer_slower_to_start_than_the_silence_is_not_dead():
    """A peer's silence counts from its first beat, not from this process's start: a host whose start-up
    (imports, the first compile) outlasts SILENT_SECONDS is not declared dead before or at its first beat."""
    store, exits = BeatsWhenRead(), []
    with watch(store, exits):
        time.sleep(0.6)  # twice the silence before worker 1's first beat (worker 2 never beats)
        store.started.set()
        time.sleep(0.6)
    assert exits == []
    assert store.beats > 1  # the watch did read worker 1's beats
