"""No state in which `train` runs without progress: a watch on the training input.

A training step asks its input for a batch inside TensorFlow. While that request waits, Python runs
nothing on the main thread: neither Ctrl-C nor the SIGTERM handler (`train.preemption`) gets a turn,
and a stream that never yields (an epoch that comes out empty, repeated for ever) holds the process at
full CPU until it is killed. So a thread of its own watches the input meter's requests and deliveries
(`pipeline.runtime.wait_meter`):

- a request left unanswered for `train.input_stall_seconds`: the watch finds where the stream is stuck
  (`pipeline.runtime.stall_probe`: the stages rebuilt one prefix at a time), prints one line saying so and
  ends the process (exit 2);
- SIGTERM or Ctrl-C while a request has been unanswered for `STOP_GRACE_SECONDS`: no step can end, so
  there is no step to save at; it prints the last checkpoint kept and ends the process at once (143,
  130). The signal reaches the thread through `signal.set_wakeup_fd`, which the C-level handler
  writes whatever the main thread is doing.

Otherwise the main thread handles its signals as before, and the watch costs a read of two counters a
second. The process ends with `os._exit`: the main thread cannot be woken from inside TensorFlow.
"""
from __future__ import annotations

import os
import queue
import select
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Optional

from tpu_pipeline.pipeline.runtime.stall_probe import where_stuck
from tpu_pipeline.pipeline.runtime.wait_meter import InputWaitMeter

# After SIGTERM or Ctrl-C: how long an unanswered request may have waited before the watch ends the run
# itself (a healthy input answers within a step; a preemption notice leaves about 30 s).
STOP_GRACE_SECONDS = 5.0
PROBE_SECONDS = 10.0  # each prefix of the stages, rebuilt, gets this long for its first element
POLL_SECONDS = 1.0
STALL_EXIT, SIGTERM_EXIT, INTERRUPTED_EXIT = 2, 143, 130

Printer = Callable[[str], None]


class StallWatch:
    """Ends the run when the training input answers no request for `seconds` (None: never), or when a
    signal comes while it answers none (see the module's docstring). A context manager around the
    training loop; `new_stream()` before each new training dataset is iterated."""

    def __init__(self, meter: InputWaitMeter, seconds: Optional[float], pipeline: Any, printer: Printer,
                 kept: Callable[[], str], exit: Callable[[int], None] = os._exit) -> None:
        self.meter = meter
        self.seconds = seconds
        self.pipeline = pipeline
        self.printer = printer
        self.kept = kept  # what a run ended now keeps (the last checkpoint), as a clause
        self._exit = exit
        self._offset = 0  # requests of earlier streams that no element will answer (their iterators are gone)
        self._stop = threading.Event()
        self._signal: Optional[int] = None
        self._thread: Optional[threading.Thread] = None
        self._wakeup: Optional[tuple[socket.socket, socket.socket]] = None
        self._previous_fd = -1

    def new_stream(self) -> None:
        """A new training dataset is about to be read: earlier ones' unanswered requests no longer count."""
        requested, delivered = self.meter.requests()
        self._offset = requested - delivered

    def __enter__(self) -> "StallWatch":
        if threading.current_thread() is threading.main_thread():
            reader, writer = socket.socketpair()
            reader.setblocking(False)
            writer.setblocking(False)
            previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
            if previous != -1:  # another user of the wakeup fd (an event loop): leave it to them
                signal.set_wakeup_fd(previous)
                reader.close()
                writer.close()
            else:
                self._wakeup = (reader, writer)
        if self.seconds or self._wakeup:
            self._thread = threading.Thread(target=self._watch, name="tpu_pipeline-stall-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * POLL_SECONDS)
        if self._wakeup is not None:
            signal.set_wakeup_fd(-1)
            for end in self._wakeup:
                end.close()
            self._wakeup = None

    def _signals(self, timeout: float) -> None:
        """Waits up to `timeout` for a signal number on the wakeup socket; keeps a SIGTERM or SIGINT."""
        if self._wakeup is None:
            self._stop.wait(timeout)
            return
        reader = self._wakeup[0]
        try:
            ready, _, _ = select.select([reader], [], [], timeout)
            data = reader.recv(64) if ready else b""
        except (OSError, ValueError):  # closed by __exit__ meanwhile
            return
        for number in data:
            if number in (signal.SIGTERM, signal.SIGINT) and self._signal is None:
                self._signal = number

    def _watch(self) -> None:
        last_delivered, since = -1, time.monotonic()
        while not self._stop.is_set():
            self._signals(POLL_SECONDS)
            if self._stop.is_set():
                return
            try:
                requested, delivered = self.meter.requests()
            except Exception:  # the process is shutting TensorFlow down
                return
            now = time.monotonic()
            waiting = requested - delivered > self._offset
            if delivered != last_delivered or not waiting:
                last_delivered, since = delivered, now
            waited = now - since
            if self._signal is not None and waiting and waited >= min(STOP_GRACE_SECONDS, self.seconds or STOP_GRACE_SECONDS):
                self._end_on_signal(waited)
                return
            if self.seconds and waiting and waited >= self.seconds:
                self._end_stalled(waited, delivered)
                return

    def _end_stalled(self, waited: float, delivered: int) -> None:
        """Finds where the stream is stuck (a signal meanwhile ends the run at once), says so, ends the process."""
        found: queue.Queue = queue.Queue()

        def probe() -> None:
            try:
                found.put(where_stuck(self.pipeline, self.meter.context, PROBE_SECONDS))
            except Exception as error:  # the line must come out whatever the probe met
                found.put(f"(where could not be found: {type(error).__name__}: {error})")

        threading.Thread(target=probe, name="tpu_pipeline-stall-probe", daemon=True).start()
        while True:
            try:
                where = found.get(timeout=POLL_SECONDS)
                break
            except queue.Empty:
                self._signals(0.0)
                if self._signal is not None:
                    self._end_on_signal(waited)
                    return
        if self._stop.is_set():  # training ended meanwhile: the main thread goes on
            return
        prefix = getattr(self.pipeline, "prefix", "data")
        self._print_error(
            f"{prefix}: the training input delivered no batch for {waited:.0f} s (train.input_stall_seconds="
            f"{self.seconds:g}; {delivered:,} batch(es) before in this process), stuck {where}; {self.kept()}; "
            "if the pipeline is only slow to start, raise train.input_stall_seconds")
        self._exit(STALL_EXIT)

    def _end_on_signal(self, waited: float) -> None:
        if self._stop.is_set():  # training ended meanwhile: the main thread handles the signal
            return
        what = ("stopped by SIGTERM" if self._signal == signal.SIGTERM else "interrupted (Ctrl-C)")
        line = (f"{what} while the training input had delivered no batch for {waited:.0f} s, so no step could end to "
                f"save at; {self.kept()}")
        if self._signal == signal.SIGTERM:
            self.printer(line)
            self._flush()
            self._exit(SIGTERM_EXIT)
        else:
            self._print_error(line, label="")
            self._exit(INTERRUPTED_EXIT)

    def _print_error(self, line: str, label: str = "error: ") -> None:
        print(f"tpu-pipeline train: {label}{line}", file=sys.stderr)
        self._flush()

    @staticmethod
    def _flush() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass


def kept_line(latest: Optional[str]) -> str:
    """What a run ended from the watch keeps: the newest checkpoint, from which the same command resumes."""
    if latest is None:
        return "no checkpoint was saved yet: the same command starts the run again from step 0"
    return (f"the last checkpoint, {latest}, is kept: start the same command again to resume from it (steps trained "
            "after it are trained again)")
