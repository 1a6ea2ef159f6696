"""On JAX with several processes: a host that falls silent stops the others with the PeerFailure line.

A step whose collective is already connected fails at once when a peer dies (a Gloo all-reduce raises, and
the job stops with its `PeerFailure` line). A collective that starts after the death does not: the first
evaluation step, or a newly compiled step, waits in its rendezvous for the dead peer, and JAX's coordination
service ends the process only after its heartbeat timeout (100 s), with a fatal C++ message and a dump of
every thread (measured: a host SIGKILLed at an epoch's end). So each process writes a beat to
`jax.distributed`'s store every `BEAT_SECONDS` and reads the others'; a peer whose beat has not changed for
`SILENT_SECONDS` is gone, and this process prints the line and ends (`os._exit`: its main thread may be
inside a collective that never returns). A process that leaves training writes `done`, which the others
take as an end, not a death. The silence is counted from a peer's first beat, so a slower start-up is
not a death.

Process 0's death needs no watch and cannot have one: it hosts the store, and JAX ends the others within a
second itself (jaxlib 0.10's client takes a callback for that, but not a Python function: tried,
`std::bad_cast`). TensorFlow's collectives raise on a dead peer by themselves; the watch is JAX's only.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Any, Callable, ContextManager, Optional

import tensorflow as tf

from tpu_pipeline.cluster import ClusterInfo
from tpu_pipeline.cluster.coordination import StoreUnavailable
from tpu_pipeline.train.framework import peer_failure

BEAT_SECONDS = 2.0
SILENT_SECONDS = 30.0  # well above a beat's worst delay (a busy host), well below JAX's own 100 s
PEER_LOST_EXIT = 2
DONE = "done"


def watching_peers(cluster: ClusterInfo, store: Any, run_key: str, checkpoint_dir: str) -> ContextManager[Any]:
    """A `PeerWatch` while training runs on JAX with several processes; elsewhere nothing (TensorFlow's
    collectives raise on a dead peer themselves)."""
    if store is None or cluster.framework != "jax":
        return contextlib.nullcontext()
    return PeerWatch(store, cluster.worker_id, cluster.num_workers, run_key,
                     lambda: tf.train.latest_checkpoint(checkpoint_dir))


class PeerWatch:
    """Beats for this process and watches the others' beats while training runs (a context manager)."""

    def __init__(self, store: Any, worker_id: int, num_workers: int, run_key: str,
                 latest_checkpoint: Callable[[], Optional[str]],
                 *, beat_seconds: float = BEAT_SECONDS, silent_seconds: float = SILENT_SECONDS,
                 exit: Callable[[int], None] = os._exit) -> None:
        self._store, self._me, self._run_key = store, worker_id, run_key
        self._peers = [worker for worker in range(num_workers) if worker != worker_id]
        self._latest_checkpoint = latest_checkpoint
        self._beat_seconds, self._silent_seconds = beat_seconds, silent_seconds
        self._exit = exit
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _key(self, worker: int) -> str:
        return f"tpu_pipeline/{self._run_key}/beat/{worker}"

    def __enter__(self) -> "PeerWatch":
        self._thread = threading.Thread(target=self._watch, name="peer-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self._store.put(self._key(self._me), DONE)
        except StoreUnavailable:
            pass  # process 0 is gone; JAX ends this process itself

    def _watch(self) -> None:
        beats, heard = 0, {peer: (None, time.monotonic()) for peer in self._peers}
        while True:
            beats += 1
            try:
                self._store.put(self._key(self._me), str(beats))
                values = {peer: self._store.peek(self._key(peer)) for peer in heard}
            except StoreUnavailable:
                return  # process 0, the store's host, is gone: JAX ends this process itself
            now = time.monotonic()
            for peer, value in values.items():
                if value is None:
                    continue  # not started yet: a peer that dies before its first beat is JAX's to end
                if value == DONE:
                    del heard[peer]
                elif value != heard[peer][0]:
                    heard[peer] = (value, now)
                elif now - heard[peer][1] > self._silent_seconds:
                    self._end(peer, now - heard[peer][1])
                    return
            if self._stop.wait(self._beat_seconds):
                return

    def _end(self, peer: int, silent: float) -> None:
        sys.stdout.flush()
        line = peer_failure(f"worker {peer} has not been heard from for {silent:.0f} s", self._latest_checkpoint())
        print(f"tpu-pipeline train: error: {line}", file=sys.stderr, flush=True)
        self._exit(PEER_LOST_EXIT)
