"""Keras callbacks of the training command: progress with input wait; checkpoints by epoch, step, time and SIGTERM."""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Optional

import tensorflow as tf

from tpu_pipeline.model import tf_keras
from tpu_pipeline.pipeline.wait_meter import InputWaitMeter
from tpu_pipeline.train.preemption import PreemptionFlag
from tpu_pipeline.train.run_files import RunFiles


class ProgressLogger(tf_keras.callbacks.Callback):
    """Every `every` steps: step, loss, accuracy, examples/s and the share of time spent waiting for input.

    The share comes from an InputWaitMeter on the training pipeline: seconds its consumer blocked,
    divided by wall time. Near 0: the accelerator is fed. Near 1: the input pipeline sets the speed.
    """

    def __init__(self, global_batch_size: int, every: int, meter: Optional[InputWaitMeter] = None,
                 total_steps: Optional[int] = None, printer: Callable[[str], None] = print,
                 epochs_total: Optional[int] = None, tokens: Optional[Any] = None) -> None:
        super().__init__()
        self.epochs_total = epochs_total
        self.tokens = tokens  # a TokenMeter on the training pipeline (data.sequence): tokens/s and non-padding
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

    def _token_counts(self) -> tuple[int, int]:
        """(real tokens, token slots) the training pipeline has delivered so far; (0, 0) without a meter."""
        if self.tokens is None:
            return 0, 0
        return int(self.tokens.real.numpy()), int(self.tokens.slots.numpy())

    def _rate(self, steps: int, seconds: float, tokens_since: Optional[tuple[int, int]]) -> str:
        """examples/s, or for token data: real tokens/s and the non-padding share of the slots."""
        if self.tokens is None or tokens_since is None:
            return f"{steps * self.global_batch_size / seconds:,.0f} examples/s"
        real, slots = (now - then for now, then in zip(self._token_counts(), tokens_since))
        return f"{real / seconds:,.0f} tokens/s, non-padding {real / max(slots, 1):.3f}"

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        self._mark = (time.perf_counter(), self._step(), self._wait())
        self._tokens_mark = self._token_counts()
        if not hasattr(self, "_first_tokens"):  # a resumed epoch's fit call and the next share one count
            self._first_tokens = self._tokens_mark

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        self._last_batch_end = time.perf_counter()  # an epoch's rate ends here, before its validation
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
        metrics = " ".join(f"{k} {v:.4f}" for k, v in logs.items() if isinstance(v, (int, float)) and k != "cross_entropy")
        if self._intervals == 1:
            self._first_tokens = self._token_counts()  # tokens/s leaves out the interval with the tracing
        self.printer(
            f"step {step}{total} {metrics} | {self._rate(steps, seconds, self._tokens_mark)}"
            f" | waiting for input {100 * wait / seconds:.0f}% of step time"
        )
        self._mark = (time.perf_counter(), step, self._wait())
        self._tokens_mark = self._token_counts()

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._epoch_mark = (time.perf_counter(), self._step(), self._wait())
        self._epoch_tokens = self._token_counts()

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        """One Keras-style line per epoch: train and validation metrics, examples/s, input wait."""
        started, first_step, first_wait = getattr(self, "_epoch_mark", (time.perf_counter(), self._step(), self._wait()))
        seconds = max(getattr(self, "_last_batch_end", time.perf_counter()) - started, 1e-9)
        steps = self._step() - first_step
        logs = logs or {}
        shown = {k: v for k, v in logs.items() if isinstance(v, (int, float)) and k != "cross_entropy"}
        if "val_cross_entropy" in shown:  # the exact validation loss (Keras's val_loss counts padding)
            shown["val_loss"] = shown.pop("val_cross_entropy")
        train = " ".join(f"{k} {v:.4f}" for k, v in shown.items() if not k.startswith("val_"))
        validation = " ".join(f"{k} {v:.4f}" for k, v in shown.items() if k.startswith("val_"))
        total = f"/{self.epochs_total}" if self.epochs_total else ""
        line = f"epoch {epoch + 1}{total}: {train}"
        line += f" | {validation}" if validation else ""
        line += f" | {self._rate(steps, seconds, getattr(self, '_epoch_tokens', None))}"
        line += f" | waiting for input {100 * (self._wait() - first_wait) / seconds:.0f}%"
        self.printer(line)

    def examples_per_second(self) -> Optional[float]:
        if not self.timed_seconds:
            return None
        return self.timed_steps * self.global_batch_size / self.timed_seconds

    def tokens_per_second(self) -> Optional[float]:
        """Real tokens per second after the first logging interval (which holds the tracing)."""
        if self.tokens is None or not self.timed_seconds:
            return None
        return (self._token_counts()[0] - self._first_tokens[0]) / self.timed_seconds

    def input_wait_fraction(self) -> Optional[float]:
        return self.timed_wait / self.timed_seconds if self.timed_seconds else None


class Checkpointer(tf_keras.callbacks.Callback):
    """Saves model + optimizer (+ its step counter, which is the input position) + the epoch history
    through RunFiles: at each epoch end, every `every_steps` steps or `every_seconds` seconds, and
    at the step `preemption.stop_now` names after a SIGTERM, after which it stops training.

    The history of finished epochs lives in the checkpoint itself (a string variable), so that
    metrics.json after any number of resumes lists every epoch, and never one the checkpoint has not.
    """

    def __init__(self, files: RunFiles, state: "TrainState", steps_per_epoch: int,
                 every_steps: Optional[int] = None, every_seconds: Optional[float] = None,
                 preemption: Optional[PreemptionFlag] = None, printer: Callable[[str], None] = print,
                 before_save: Optional[Callable[[int], None]] = None) -> None:
        super().__init__()
        self.before_save = before_save  # called with the step before each save (a windowed input's position)
        self.files = files
        self.steps_per_epoch = steps_per_epoch
        self.state = state
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.preemption = preemption
        self.printer = printer
        self.preempted_at: Optional[int] = None
        self._last_step = -1
        self._last_time = time.monotonic()

    def _step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def save(self, why: str) -> str:
        step = self._step()
        if step == self._last_step:
            return self.files.latest_checkpoint
        if self.before_save is not None:
            self.before_save(step)
        path = self.files.save_checkpoint(step)
        self._last_step, self._last_time = step, time.monotonic()
        self.printer(f"saved checkpoint {path} at step {step} ({why})")
        return path

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        self._last_step, self._last_time = self._step(), time.monotonic()

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        self._last_batch_end = time.perf_counter()  # an epoch's rate ends here, before its validation
        step = self._step()
        epoch_end = step % self.steps_per_epoch == 0  # on_epoch_end saves it, with the epoch's history
        if self.preemption is not None and self.preemption.stop_now(step):
            self.preempted_at = step
            self.model.stop_training = True
            if not epoch_end:
                self.save("SIGTERM")
            return
        if epoch_end:
            return
        if self.every_steps and step - self._last_step >= self.every_steps:
            self.save(f"every {self.every_steps} steps")
        elif self.every_seconds and time.monotonic() - self._last_time >= self.every_seconds:
            self.save(f"every {self.every_seconds:g} s")

    def on_epoch_end(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        if self.preempted_at is not None and self.preempted_at % self.steps_per_epoch:
            return  # an epoch cut short by SIGTERM is not finished: its logs cover part of it
        self.state.finish_epoch(epoch, logs or {})
        self.save(f"epoch {epoch + 1}" + (", SIGTERM" if self.preempted_at is not None else ""))


class TrainState:
    """What a checkpoint holds besides the model and optimizer: epochs finished and their logs."""

    def __init__(self) -> None:
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.history_json = tf.Variable("{}", dtype=tf.string, trainable=False, name="history")

    def history(self) -> dict[str, list[float]]:
        return json.loads(self.history_json.numpy().decode())

    def finish_epoch(self, epoch: int, logs: dict[str, Any]) -> None:
        history = self.history()
        logs = dict(logs)
        logs.pop("cross_entropy", None)  # in training, the loss without regularization: `loss` says it
        if "val_cross_entropy" in logs:
            # Keras's val_loss counts the zero-weight padding of an exact evaluation; this does not.
            logs["val_loss"] = logs.pop("val_cross_entropy")
        for name, value in logs.items():
            if isinstance(value, (int, float)) or hasattr(value, "numpy"):
                history.setdefault(name, []).append(float(value))
        history.setdefault("epoch", []).append(epoch + 1)
        self.history_json.assign(json.dumps(history))
        self.epoch.assign(epoch + 1)
