"""Keras callbacks of the training command: progress with input wait; checkpoints by epoch, step, time and SIGTERM."""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Optional

import tensorflow as tf

from tpu_pipeline.model import tf_keras
from tpu_pipeline.model.tasks import Task, task_named
from tpu_pipeline.pipeline.mixtures.share_meter import shares_line
from tpu_pipeline.pipeline.runtime.wait_meter import InputWaitMeter
from tpu_pipeline.train.preemption import PreemptionFlag
from tpu_pipeline.train.run_files import RunFiles



class StepClock:
    """Cumulative time spent in training steps, and what those steps trained.

    A step's time runs from Keras's `on_train_batch_begin` to its `on_train_batch_end` (input
    waits included: the step fetches its batch); what happens between steps is not in it:
    validation at an epoch's end, checkpoint saves, logging, start-up. The first step of each
    `fit` call is left out too (tracing and XLA compilation, the input pipeline's first fill).
    Tokens (a TokenMeter) and input waits (an InputWaitMeter) are read at each step's end and
    each step is given what arrived since the previous step's end: a prefetch buffer's fill
    between steps is counted with the next step that consumes from it.
    """

    def __init__(self, meter: Optional[InputWaitMeter] = None, tokens: Optional[Any] = None) -> None:
        self.meter = meter
        self.tokens = tokens
        self.seconds = 0.0  # in the timed steps
        self.steps = 0
        self.real = 0  # real tokens delivered to the timed steps (token data only)
        self.slots = 0
        self.wait = 0.0  # seconds of those steps spent waiting for input
        self._previous: Optional[tuple[int, int, int, float]] = None  # (step, real, slots, wait) at the last step's end
        self._began = 0.0

    def snapshot(self) -> tuple[float, int, int, int, float]:
        return self.seconds, self.steps, self.real, self.slots, self.wait

    def fit_begins(self) -> None:
        self._previous = None  # the next step is the first of a fit call: not timed

    def step_begins(self) -> None:
        self._began = time.perf_counter()

    def step_ends(self, step: int) -> None:
        ended = time.perf_counter()
        real, slots = (int(self.tokens.real.numpy()), int(self.tokens.slots.numpy())) if self.tokens is not None else (0, 0)
        wait = self.meter.totals()[0] if self.meter is not None else 0.0
        if self._previous is not None:
            last_step, last_real, last_slots, last_wait = self._previous
            self.seconds += ended - self._began
            self.steps += step - last_step
            self.real += real - last_real
            self.slots += slots - last_slots
            self.wait += wait - last_wait
        self._previous = (step, real, slots, wait)


class StepTracker(tf_keras.callbacks.Callback):
    """The global step at each batch's end, counted, for a model whose variables cannot be read mid-fit.

    Keras 3's JAX trainer keeps the state apart from the model's variables during an epoch (it
    detaches them), so `optimizer.iterations` says the step only at the fit's start; reading it at
    every batch would mean re-attaching the whole state at every step. Put first in the callbacks, so
    the others read `step` after it was counted.
    """

    def __init__(self) -> None:
        super().__init__()
        self.step = 0
        self._epoch_base = 0

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        self.step = self._epoch_base = int(self.model.optimizer.iterations.numpy())

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._epoch_base = self.step

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        self.step = self._epoch_base + batch + 1


def _step_of(callback: Any, steps: Optional[StepTracker]) -> int:
    return steps.step if steps is not None else int(callback.model.optimizer.iterations.numpy())


class ProgressLogger(tf_keras.callbacks.Callback):
    """Every `every` steps: step, metrics, examples/s (token data: tokens/s and non-padding) and the
    share of step time spent waiting for input; one line per epoch; the run's totals for metrics.json.

    Every rate it prints or returns has one meaning: what the timed training steps trained, divided
    by the time spent in them (`StepClock`: no validation, checkpoint, logging, start-up or first-step
    compilation time). So the final figure is the weighted mean of the epochs' and intervals' figures.
    The wait share comes from an InputWaitMeter on the training pipeline: near 0, the accelerator is
    fed; near 1, the input pipeline sets the speed.
    """

    def __init__(self, global_batch_size: int, every: int, meter: Optional[InputWaitMeter] = None,
                 total_steps: Optional[int] = None, printer: Callable[[str], None] = print,
                 epochs_total: Optional[int] = None, tokens: Optional[Any] = None,
                 task: Optional[Task] = None, sources: Optional[Any] = None, mixture: Optional[Any] = None,
                 steps: Optional[StepTracker] = None) -> None:
        super().__init__()
        self.tracker = steps
        self.sources = sources  # a SourceMeter on a mixture's training pipeline, and its config: shares per epoch
        self.mixture = mixture
        self._sources_mark = sources.totals() if sources is not None else None
        self.task = task or task_named("classification")  # its `reported` names the figures of each line
        self.epochs_total = epochs_total
        self.tokens = tokens  # a TokenMeter on the training pipeline (data.sequence): tokens/s and non-padding
        self.global_batch_size = global_batch_size
        self.every = every
        self.meter = meter
        self.total_steps = total_steps
        self.printer = printer
        self.clock = StepClock(meter, tokens)
        self._mark: Optional[tuple[int, tuple[float, int, int, int, float]]] = None  # (step, clock) at the last line
        self._epoch_mark = self.clock.snapshot()

    def _step(self) -> int:
        return _step_of(self, self.tracker)

    def _since(self, mark: tuple[float, int, int, int, float]) -> str:
        """The rate and input wait of the timed steps since `mark` (a clock snapshot)."""
        seconds, steps, real, slots, wait = (now - then for now, then in zip(self.clock.snapshot(), mark))
        if seconds <= 0:
            return "no rate yet: the first step of a run holds tracing and compilation, and is not timed"
        if self.tokens is None:
            rate = f"{steps * self.global_batch_size / seconds:,.0f} examples/s"
        elif slots == 0:  # Keras 3 on JAX reads batches ahead of its steps: they came before these (counted there)
            rate = "tokens/s not counted yet: these steps' batches were read ahead, before them"
        else:
            rate = f"{real / seconds:,.0f} tokens/s, non-padding {real / slots:.3f}"
        return f"{rate} | waiting for input {100 * wait / seconds:.0f}% of step time"

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        self.clock.fit_begins()
        self._mark = (self._step(), self.clock.snapshot())

    def on_train_batch_begin(self, batch: int, logs: Optional[dict] = None) -> None:
        self.clock.step_begins()

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        step = self._step()
        self.clock.step_ends(step)
        last_step, mark = self._mark
        if step - last_step < self.every:
            return
        logs = logs or {}
        total = f"/{self.total_steps}" if self.total_steps else ""
        metrics = " ".join(f"{k} {v:.4f}" for k, v in self.task.reported(logs).items() if isinstance(v, (int, float)))
        self.printer(f"step {step}{total} {metrics} | {self._since(mark)}")
        self._mark = (step, self.clock.snapshot())

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._epoch_mark = self.clock.snapshot()
        if self.sources is not None:
            self._sources_mark = self.sources.totals()

    def _source_shares(self) -> str:
        """The epoch's delivered shares by source beside the weights (a mixture), or ''."""
        if self.sources is None:
            return ""
        (examples, tokens), (examples0, tokens0) = self.sources.totals(), self._sources_mark
        return " | " + shares_line(self.mixture, [a - b for a, b in zip(examples, examples0)],
                                   [a - b for a, b in zip(tokens, tokens0)])

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        """One Keras-style line per epoch: train and validation metrics, the rate and input wait of its steps."""
        logs = logs or {}
        shown = {k: v for k, v in self.task.reported(logs).items() if isinstance(v, (int, float))}
        train = " ".join(f"{k} {v:.4f}" for k, v in shown.items() if not k.startswith("val_"))
        validation = " ".join(f"{k} {v:.4f}" for k, v in shown.items() if k.startswith("val_"))
        total = f"/{self.epochs_total}" if self.epochs_total else ""
        line = f"epoch {epoch + 1}{total}: {train}"
        line += f" | {validation}" if validation else ""
        self.printer(f"{line} | {self._since(self._epoch_mark)}{self._source_shares()}")

    def step_seconds(self) -> float:
        """Seconds spent in the timed training steps (metrics.json's step_seconds)."""
        return self.clock.seconds

    def examples_per_second(self) -> Optional[float]:
        """Rows (examples) of the timed steps per second of them; None before any timed step."""
        if not self.clock.seconds:
            return None
        return self.clock.steps * self.global_batch_size / self.clock.seconds

    def tokens_per_second(self) -> Optional[float]:
        """Real tokens trained in the timed steps per second of them (padding not counted); None before any
        timed step, or where those steps took only batches read before them (a run of two steps): not 0."""
        if self.tokens is None or not self.clock.seconds or not self.clock.slots:
            return None
        return self.clock.real / self.clock.seconds

    def input_wait_fraction(self) -> Optional[float]:
        return self.clock.wait / self.clock.seconds if self.clock.seconds else None


EVALUATION_LINE_SECONDS = 30.0


class EvaluationProgress(tf_keras.callbacks.Callback):
    """A line every 30 s while an evaluation runs: how many of its batches are done, and about how long the
    rest will take. A pass over a large validation split printed nothing for minutes (9 on a 137 MB corpus),
    which reads as a hang; the first line also names train.eval_steps, which shortens it."""

    def __init__(self, steps: Optional[int], printer: Callable[[str], None],
                 every_seconds: Optional[float] = None) -> None:
        super().__init__()
        self.steps = steps
        self.printer = printer
        self.every_seconds = EVALUATION_LINE_SECONDS if every_seconds is None else every_seconds
        self._began = self._last = 0.0
        self._lines = 0

    def on_test_begin(self, logs: Optional[dict] = None) -> None:
        self._began = self._last = time.monotonic()
        self._lines = 0

    def on_test_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        now = time.monotonic()
        if now - self._last < self.every_seconds:
            return
        self._last = now
        done, elapsed = batch + 1, now - self._began
        if self.steps:
            left = elapsed / done * (self.steps - done)
            line = f"evaluating: {done:,} of {self.steps:,} batches in {elapsed:.0f} s, about {_duration(left)} to go"
        else:
            line = f"evaluating: {done:,} batches in {elapsed:.0f} s"
        if self._lines == 0:
            line += " (train.eval_steps evaluates fewer batches)"
        self._lines += 1
        self.printer(line)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


class PreemptionStop(Exception):
    """Raised by the Checkpointer out of `fit` once the SIGTERM checkpoint is saved: nothing of `fit`
    runs after it (no validation at the epoch's end, no epoch-end callbacks), so the process exits
    within the seconds a preemption notice leaves. `train` catches it, writes the metrics so far and
    exits 143. Not an error a user sees."""

    def __init__(self, step: int) -> None:
        super().__init__(f"stopped by SIGTERM at step {step}")
        self.step = step


class Checkpointer(tf_keras.callbacks.Callback):
    """Saves model + optimizer (+ its step counter, which is the input position) + the epoch history
    through RunFiles: at each epoch end, every `every_steps` steps or `every_seconds` seconds, and
    at the step `preemption.stop_now` names after a SIGTERM, after which it raises PreemptionStop out
    of `fit`: Keras would otherwise still validate at the end of the epoch it stops in.

    A SIGTERM that arrives during an epoch-end validation (one process) ends that validation at its
    next batch: the epoch's training is done, so it is saved as finished, without validation figures.
    With several workers the stop waits for the next training step, which every worker agrees on.

    The history of finished epochs lives in the checkpoint itself (a string variable), so that
    metrics.json after any number of resumes lists every epoch, and never one the checkpoint has not.
    """

    def __init__(self, files: RunFiles, state: "TrainState", steps_per_epoch: int,
                 every_steps: Optional[int] = None, every_seconds: Optional[float] = None,
                 preemption: Optional[PreemptionFlag] = None, printer: Callable[[str], None] = print,
                 before_save: Optional[Callable[[int], None]] = None, steps: Optional[StepTracker] = None) -> None:
        super().__init__()
        self.tracker = steps
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
        self._train_logs: dict[str, Any] = {}  # the last training step's logs: an epoch's figures at its end

    def _step(self) -> int:
        return _step_of(self, self.tracker)

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
        self._train_logs = dict(logs or {})
        step = self._step()
        epoch_end = step % self.steps_per_epoch == 0  # on_epoch_end saves it, with the epoch's history
        if self.preemption is not None and self.preemption.stop_now(step):
            self._stop(step)
        if epoch_end:
            return
        if self.every_steps and step - self._last_step >= self.every_steps:
            self.save(f"every {self.every_steps} steps")
        elif self.every_seconds and time.monotonic() - self._last_time >= self.every_seconds:
            self.save(f"every {self.every_seconds:g} s")

    def on_test_begin(self, logs: Optional[dict] = None) -> None:
        self._stop_validation()

    def on_test_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        self._stop_validation()

    def _stop_validation(self) -> None:
        """A SIGTERM during fit's validation (at an epoch's end) stops it there, on one process. With several
        workers every one must stop at the same training step (`StopAgreement`), so they go on to it."""
        if self.preemption is not None and self.preemption.agreement is None and self.preemption.requested:
            self._stop(self._step())

    def _stop(self, step: int) -> None:
        """Saves the SIGTERM checkpoint at `step` and leaves `fit` at once (PreemptionStop). At an epoch's
        end the epoch is finished: its training figures go into the history, its validation never runs."""
        self.preempted_at = step
        self.model.stop_training = True
        by = self.preemption.reason
        if step % self.steps_per_epoch == 0 and step // self.steps_per_epoch > int(self.state.epoch.numpy()):
            epoch = step // self.steps_per_epoch
            self.state.finish_epoch(epoch - 1, self._train_logs)
            self.save(f"epoch {epoch}, {by}")
        else:
            self.save(by)
        raise PreemptionStop(step)

    def on_epoch_end(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        self.state.finish_epoch(epoch, logs or {})
        self.save(f"epoch {epoch + 1}")


def _is_figure(value: Any) -> bool:
    """A number Keras logged (a Python number or a tensor), as opposed to anything else in its logs."""
    return isinstance(value, (int, float)) or hasattr(value, "numpy")


class TrainState:
    """What a checkpoint holds besides the model and optimizer: epochs finished and their logs."""

    def __init__(self, task: Optional[Task] = None) -> None:
        self.task = task or task_named("classification")  # its `reported` names what the history keeps
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.history_json = tf.Variable("{}", dtype=tf.string, trainable=False, name="history")
        # (epoch, Keras's validation figures without their "val_" prefix) of the last epoch this process
        # finished, when `fit` validated it: not saved, since only this process's weights are known to match.
        self.last_validation: Optional[tuple[int, dict[str, float]]] = None

    def history(self) -> dict[str, list[float]]:
        return json.loads(self.history_json.numpy().decode())

    def finish_epoch(self, epoch: int, logs: dict[str, Any]) -> None:
        history = self.history()
        for name, value in self.task.reported(logs).items():
            if _is_figure(value):
                history.setdefault(name, []).append(float(value))
        history.setdefault("epoch", []).append(epoch + 1)
        self.history_json.assign(json.dumps(history))
        self.epoch.assign(epoch + 1)
        validation = {name[len("val_"):]: float(value) for name, value in logs.items()
                      if name.startswith("val_") and _is_figure(value)}
        self.last_validation = (epoch, validation) if validation else None

    def validation_after(self, epoch: int) -> Optional[dict[str, float]]:
        """What `fit`'s validation measured at the end of `epoch` (0-based) in this process, as
        `model.evaluate(return_dict=True)` returns it; None when it did not validate that epoch here."""
        if self.last_validation is None or self.last_validation[0] != epoch:
            return None
        return dict(self.last_validation[1])
