"""How often `train` saves between epoch ends: what a SIGKILL may lose against what saving costs.

A SIGTERM (a preemption notice) saves at the next step, so it loses nothing; a SIGKILL (an OOM
kill, a VM gone without notice) loses every step since the last save. Epochs can be hours long, so
step checkpoints are on by default: `train.checkpoint_every_seconds: auto` saves every
AUTO_CHECKPOINT_SECONDS, and when a save itself takes longer than AUTO_MAX_SAVE_SHARE of that (a
large model written to gs://), waits (1 / share - 1) times the last save's duration instead, so saving
never costs more than that share of the training time. Seconds, not steps: what a user can afford to
lose is wall time, and a step takes milliseconds on one machine and seconds on another.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

from tpu_pipeline.config.train import AUTO_CHECKPOINT_SECONDS, AUTO_MAX_SAVE_SHARE, TrainConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.train.callbacks import Checkpointer


@dataclasses.dataclass(frozen=True)
class Cadence:
    """When to save besides epoch ends and SIGTERM: every `steps` steps and/or `seconds` seconds;
    `stretch`: lengthen `seconds` when saves are slow (auto)."""

    steps: Optional[int] = None
    seconds: Optional[float] = None
    stretch: bool = False
    note: Optional[str] = None  # a line to print: why auto saves by time are off

    def describe(self) -> str:
        """When checkpoints are saved, in one phrase for the start of training."""
        extra = [f"every {self.steps} steps"] if self.steps is not None else []
        if self.seconds is not None:
            extra.append(f"every {self.seconds:g} s" + (" (longer if a save is slow)" if self.stretch else ""))
        return "checkpoints " + (", ".join(extra) + ", " if extra else "") + "at epoch ends and on SIGTERM"


def cadence(train: TrainConfig, num_workers: int) -> Cadence:
    """The step checkpoints of `train` on `num_workers` TF_CONFIG workers (one process: 1)."""
    seconds = train.checkpoint_every_seconds
    if seconds == "auto":
        if train.checkpoint_every_steps is not None:
            return Cadence(steps=train.checkpoint_every_steps)
        if num_workers > 1:
            # Every worker must save the same step, and each would read its own clock.
            return Cadence(note=("train.checkpoint_every_seconds=auto saves by time on one process only (the workers' "
                                 "clocks differ); set train.checkpoint_every_steps for step checkpoints on several "
                                 "workers (now: at epoch ends and on SIGTERM)"))
        return Cadence(seconds=AUTO_CHECKPOINT_SECONDS, stretch=True)
    if seconds is not None and num_workers > 1:
        raise ConfigError(
            "train.checkpoint_every_seconds: with several TF_CONFIG workers every worker must save at the same "
            "step, and their clocks differ; use train.checkpoint_every_steps instead"
        )
    return Cadence(steps=train.checkpoint_every_steps, seconds=seconds)


class TimedCheckpointer(Checkpointer):
    """A Checkpointer that times its saves (`save_seconds`, `periodic_seconds` for those between epoch
    ends) and, with a stretching cadence, never saves by time more often than keeps saving under
    AUTO_MAX_SAVE_SHARE of the time."""

    def __init__(self, *args, plan: Cadence, clock: Callable[[], float] = time.perf_counter, **kwargs) -> None:
        super().__init__(*args, every_steps=plan.steps, every_seconds=plan.seconds, **kwargs)
        self.plan = plan
        self.clock = clock
        self.save_seconds = 0.0
        self.periodic_seconds = 0.0
        self.saves = 0

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        super().on_train_begin(logs)
        self._first_batch = True

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        if getattr(self, "_first_batch", False):
            # The first step holds tracing and compilation (minutes for a large model on a TPU): the
            # clock of saves by time starts after it.
            self._first_batch = False
            self._last_time = time.monotonic()
        super().on_train_batch_end(batch, logs)

    def save(self, why: str) -> str:
        before = self._last_step
        started = self.clock()
        path = super().save(why)
        if self._last_step == before:  # this step was saved already: nothing written
            return path
        took = self.clock() - started
        self.saves += 1
        self.save_seconds += took
        if why.startswith("every "):
            self.periodic_seconds += took
        if self.plan.stretch and self.plan.seconds is not None:
            share = AUTO_MAX_SAVE_SHARE
            self.every_seconds = max(self.plan.seconds, took * (1 - share) / share)
        return path
