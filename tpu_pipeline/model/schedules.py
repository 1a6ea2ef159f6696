"""Learning-rate schedules from config, as Keras LearningRateSchedules (so they serialize).

Both are Keras's own `CosineDecay` (warm-up built in since Keras 2.13), so a checkpoint or saved
model restores them without custom-object registration:
- cosine: linear warm-up 0 → learning_rate over warmup steps, then cosine down to
  final_fraction * learning_rate at the last training step;
- constant: the same warm-up, then alpha=1 (a cosine that does not decay).

A warm-up is given in epochs, so one written for a long run can cover a short one whole (the
demo's 1 epoch in a 1-epoch smoke test): it is then shrunk to half the run, and `warmup_note`
says so in one line, instead of refusing the run or never reaching the learning rate.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Optional

from tpu_pipeline.config.model import ScheduleConfig
from tpu_pipeline.errors import ConfigError


def schedule_steps(config: ScheduleConfig, steps_per_epoch: Optional[int], epochs: int) -> tuple[int, int]:
    """Returns (warmup_steps, total_steps); total is 0 when unknown and not needed (constant)."""
    if epochs < 1:
        raise ConfigError(f"epochs: must be at least 1, got {epochs}")
    needs_steps = config.name == "cosine" or config.warmup_epochs > 0
    if steps_per_epoch is None:
        if needs_steps:
            what = "model.schedule.name='cosine'" if config.name == "cosine" else "model.schedule.warmup_epochs"
            raise ConfigError(
                f"{what} needs the number of training steps, but steps_per_epoch is unknown; pass "
                "steps_per_epoch (records // global batch) or use schedule 'constant' without warm-up"
            )
        return 0, 0
    if steps_per_epoch < 1:
        raise ConfigError(f"steps_per_epoch: must be at least 1, got {steps_per_epoch}")
    total = steps_per_epoch * epochs
    warmup = _given_warmup(config, steps_per_epoch)
    if warmup >= total:
        warmup = total // 2  # see warmup_note
    return warmup, total


def _given_warmup(config: ScheduleConfig, steps_per_epoch: int) -> int:
    return int(round(config.warmup_epochs * steps_per_epoch))


def warmup_note(config: ScheduleConfig, steps_per_epoch: Optional[int], epochs: int) -> Optional[str]:
    """One line when the warm-up given in epochs covers the whole run and is shrunk to half of it (None otherwise)."""
    if steps_per_epoch is None or steps_per_epoch < 1 or epochs < 1:
        return None
    given, total = _given_warmup(config, steps_per_epoch), steps_per_epoch * epochs
    if given < total:
        return None
    instead = (f"warming up over its first {_steps(total // 2)} (half the run) instead" if total > 1
               else "no warm-up instead (a run of one step)")
    return (f"model.schedule.warmup_epochs={config.warmup_epochs:g} ({_steps(given)}) covers the whole {epochs}-epoch "
            f"run ({_steps(total)}): {instead}; set model.schedule.warmup_epochs below {epochs} to choose")


def _steps(count: int) -> str:
    return f"{count:,} step" + ("" if count == 1 else "s")


def build_schedule(keras: ModuleType, config: ScheduleConfig, steps_per_epoch: Optional[int],
                   epochs: int) -> Any:
    """Returns a `keras.optimizers.schedules.LearningRateSchedule` for the whole run."""
    warmup, total = schedule_steps(config, steps_per_epoch, epochs)
    peak = float(config.learning_rate)
    if config.name == "cosine":
        decay_steps, alpha = total - warmup, float(config.final_fraction)
    else:
        decay_steps, alpha = 1, 1.0
    cosine = keras.optimizers.schedules.CosineDecay
    if warmup == 0:
        return cosine(initial_learning_rate=peak, decay_steps=decay_steps, alpha=alpha, name=config.name)
    return cosine(
        initial_learning_rate=0.0, decay_steps=decay_steps, alpha=alpha,
        warmup_target=peak, warmup_steps=warmup, name=config.name,
    )
