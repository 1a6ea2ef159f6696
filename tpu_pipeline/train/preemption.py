"""SIGTERM (or Ctrl-C) → a checkpoint at a step every training process agrees on, then exit 143 (130).

Cloud TPU VMs, GCE spot VMs and Kubernetes send SIGTERM some seconds before they kill. On one
process the step to save at is simply the next one. With several TF_CONFIG workers only some of
them may get the signal, and all must save the same step (each save of a synchronous step needs
every worker) and then stop. The first worker to see its SIGTERM publishes "stop at step s + 1" in
the cluster's key-value store and waits until every worker has read it; a watcher thread on each
worker reads it, so nothing is exchanged per step. Workers run in lockstep (every step all-reduces),
so each reaches the published step at the same callback and saves there.

TF's `PreemptionCheckpointHandler` does this for MultiWorkerMirroredStrategy, but its
`save_checkpoint_if_preempted` returns at once on GCE CPU and TPU VMs (our users' machines), it
restores by itself at construction and exits the process its own way; so the protocol is ours,
on the same store TF uses.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Any, Optional

from tpu_pipeline.cluster.coordination import KeyValueStore, StoreUnavailable

_DONE = "done"
# How long worker 0, which hosts the store, waits at the end for its peers to be done with it.
_CLOSE_WAIT_SECONDS = 60.0


class StopAgreement:
    """The cluster-wide "stop at step N" of one training run, over a key-value store."""

    def __init__(self, store: KeyValueStore, worker_id: int, num_workers: int, run_key: str) -> None:
        self.store = store
        self.worker_id = worker_id
        self.num_workers = num_workers
        self.key = f"tpu_pipeline/{run_key}/stop_at_step"
        self.step: Optional[int] = None  # set by the watcher once any worker announced
        self._watcher = threading.Thread(target=self._watch, name="tpu_pipeline-stop-watcher", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        try:
            value = self.store.get(self.key)
            if value is None or value == _DONE:
                return
            self.step = int(value)
            self.store.set(f"{self.key}/ack/{self.worker_id}", "1")
        except StoreUnavailable:
            return  # the host exited: training is over or failing, and says so on the main thread

    def announce(self, step: int) -> int:
        """Publishes `step` (unless another worker was first) and returns the agreed step once
        every worker has read it, so that none can pass it unaware."""
        self.store.set(self.key, str(step))
        agreed = self.store.get(self.key)
        if agreed == _DONE:  # a peer already finished training: there is nothing left to stop
            return step
        for worker in range(self.num_workers):
            self.store.get(f"{self.key}/ack/{worker}")
        return int(agreed)

    def close(self, wait_for_peers: bool = True) -> None:
        """Releases every worker's watcher (the first value set stays, so this is harmless after a stop).

        Worker 0 hosts the store (the chief, or worker 0 without one) and waits until every peer
        has closed too: a peer that finishes its last step a moment later must still find the store,
        or it would fail a run that succeeded. A run that is failing (`wait_for_peers=False`: a peer
        died, a record was bad) waits for nobody: a dead peer never closes, and worker 0 spent
        _CLOSE_WAIT_SECONDS before its "start every worker again". A peer that cannot reach the store
        any more only means the host has already gone, so that is not an error here.
        """
        try:
            self.store.set(self.key, _DONE)
            self.store.set(f"{self.key}/closed/{self.worker_id}", "1")
            if self.worker_id == 0 and wait_for_peers:
                for worker in range(1, self.num_workers):
                    self.store.get(f"{self.key}/closed/{worker}", timeout_seconds=_CLOSE_WAIT_SECONDS)
        except StoreUnavailable:
            pass


STOPPED_BY = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}
EXIT_CODES = {"SIGTERM": 143, "Ctrl-C": 130}  # 128 + the signal: what a scheduler or a shell reads
CTRL_C_LINE = ("Ctrl-C: saving a checkpoint after this step, then stopping (the same command resumes); "
               "press Ctrl-C again to quit at once without saving\n")


class Preempted(SystemExit):
    """Training stopped on SIGTERM (or Ctrl-C) after saving a checkpoint; exit code 143 (128 + SIGTERM; 130
    after Ctrl-C) tells a scheduler or a shell the job did not finish and should be started again."""

    def __init__(self, code: int = 143) -> None:
        super().__init__(code)


class PreemptionFlag:
    """SIGTERM or Ctrl-C sets `requested`; `stop_now(step)` says when this process should save and stop.

    Ctrl-C is what users press far more often than a scheduler sends SIGTERM, and it lost every step since
    the last checkpoint: the first one now saves and stops like a SIGTERM, and a second one quits at once
    (KeyboardInterrupt, as before). Installed only from the main thread (Python delivers signals there); a
    thread that trains keeps the default handlers.
    """

    def __init__(self, agreement: Optional[StopAgreement] = None) -> None:
        self.requested = False
        self.stopped_by: Optional[str] = None  # "SIGTERM" or "Ctrl-C": the first that asked
        self.agreement = agreement
        self._stop_step: Optional[int] = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "PreemptionFlag":
        if threading.current_thread() is threading.main_thread():
            for signum in STOPPED_BY:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.stopped_by == "Ctrl-C":  # the second Ctrl-C: at once
            signal.signal(signal.SIGINT, self._previous.pop(signal.SIGINT))
            raise KeyboardInterrupt
        if signum == signal.SIGINT:
            os.write(2, CTRL_C_LINE.encode())  # not print: the main thread may be inside a print
        self.stopped_by = self.stopped_by or STOPPED_BY[signum]
        self.requested = True

    @property
    def reason(self) -> str:
        """What the stop is called in lines and metrics.json: "Ctrl-C", else "SIGTERM" (also when a peer asked)."""
        return self.stopped_by or "SIGTERM"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.reason]

    def stop_now(self, step: int) -> bool:
        """True once this process has finished the step at which it (and all its peers) must stop."""
        if self.agreement is None:
            return self.requested
        if self._stop_step is None:
            if self.requested:
                self._stop_step = self.agreement.announce(step + 1)
            elif self.agreement.step is not None:
                self._stop_step = self.agreement.step
        return self._stop_step is not None and step >= self._stop_step

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        if self.agreement is not None:
            # Training that ended, or stopped at the agreed step (Preempted is a SystemExit), waits for its
            # peers to close; training that fails (an error, a second Ctrl-C) does not.
            self.agreement.close(wait_for_peers=exc_type is None or issubclass(exc_type, SystemExit))
