"""Keras callbacks of the training command: progress with input wait, and epoch checkpoints."""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

import tensorflow as tf

from tpu_pipeline.model import tf_keras
from tpu_pipeline.pipeline.wait_meter import InputWaitMeter


class ProgressLogger(tf_keras.callbacks.Callback):
    """Every `every` steps: step, loss, accuracy, examples/s and the share of time spent waiting for input.

    The share comes from an InputWaitMeter on the training pipeline: seconds its consumer blocked,
    divided by wall time. Near 0: the accelerator is fed. Near 1: the input pipeline sets the speed.
    """

    def __init__(self, global_batch_size: int, every: int, meter: Optional[InputWaitMeter] = None,
                 total_steps: Optional[int] = None, printer: Callable[[str], None] = print) -> None:
        super().__init__()
        self.global_batch_size = global_batch_size
        self.every = every
        self.meter = meter
        self.total_steps = total_steps
        self.printer = printer
        self.timed_seconds = 0.0  # wall time after the first interval (which includes tracing)
        self.timed_steps = 0
        self.timed_wait = 0.0
        self._mark: Optional[tuple[float, int, float]] = None
        self._intervals = 0

    def _step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def _wait(self) -> float:
        return self.meter.totals()[0] if self.meter is not None else 0.0

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        self._mark = (time.perf_counter(), self._step(), self._wait())

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        step = self._step()
        started, last_step, last_wait = self._mark
        if step - last_step < self.every:
            return
        seconds, wait = time.perf_counter() - started, self._wait() - last_wait
        steps = step - last_step
        self._intervals += 1
        if self._intervals > 1:  # the first interval holds graph tracing and compilation
            self.timed_seconds += seconds
            self.timed_steps += steps
            self.timed_wait += wait
        logs = logs or {}
        total = f"/{self.total_steps}" if self.total_steps else ""
        metrics = " ".join(f"{k} {v:.4f}" for k, v in logs.items() if isinstance(v, (int, float)))
        self.printer(
            f"step {step}{total} {metrics} | {steps * self.global_batch_size / seconds:,.0f} examples/s"
            f" | waiting for input {100 * wait / seconds:.0f}% of step time"
        )
        self._mark = (time.perf_counter(), step, self._wait())

    def examples_per_second(self) -> Optional[float]:
        if not self.timed_seconds:
            return None
        return self.timed_steps * self.global_batch_size / self.timed_seconds

    def input_wait_fraction(self) -> Optional[float]:
        return self.timed_wait / self.timed_seconds if self.timed_seconds else None


class EpochCheckpoint(tf_keras.callbacks.Callback):
    """Saves model + optimizer (+ its step counter) + epoch with a CheckpointManager after each epoch."""

    def __init__(self, manager: tf.train.CheckpointManager, epoch: tf.Variable,
                 printer: Callable[[str], None] = print) -> None:
        super().__init__()
        self.manager = manager
        self.epoch = epoch
        self.printer = printer

    def on_epoch_end(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        self.epoch.assign(epoch + 1)
        step = int(self.model.optimizer.iterations.numpy())
        path = self.manager.save(checkpoint_number=step)
        self.printer(f"saved checkpoint {path} at step {step} (epoch {epoch + 1})")
