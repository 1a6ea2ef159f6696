"""Step checkpoints are on by default (train.checkpoint_every_seconds: auto), so a SIGKILL loses at most
the interval's steps; a slow save stretches the interval so saving stays under its share of the time."""
from __future__ import annotations

import re

import pytest
import tensorflow as tf

from tpu_pipeline.cluster import resolve
from tpu_pipeline.config import config_from_dict
from tpu_pipeline.config.cluster import ClusterConfig
from tpu_pipeline.config.train import AUTO_CHECKPOINT_SECONDS, AUTO_MAX_SAVE_SHARE, TrainConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.train import cadence as cadence_module
from tpu_pipeline.train.cadence import Cadence, TimedCheckpointer, cadence
from tpu_pipeline.train.callbacks import TrainState
from tpu_pipeline.train.run_files import RunFiles

from test_text_lm import converted, lm_config

pytestmark = pytest.mark.tf_builds


def test_step_checkpoints_are_on_by_default_by_time_on_one_process():
    assert TrainConfig().checkpoint_every_seconds == "auto"
    assert cadence(TrainConfig(), num_workers=1) == Cadence(seconds=AUTO_CHECKPOINT_SECONDS, stretch=True)
    assert cadence(TrainConfig(), 1).describe() == (
        f"checkpoints every {AUTO_CHECKPOINT_SECONDS:g} s (longer if a save is slow), at epoch ends and on SIGTERM")


def test_steps_given_replace_auto_and_numbers_are_exact():
    assert cadence(TrainConfig(checkpoint_every_steps=50), 1) == Cadence(steps=50)
    assert cadence(TrainConfig(checkpoint_every_seconds=30), 1) == Cadence(seconds=30.0)
    assert cadence(TrainConfig(checkpoint_every_seconds=None), 1) == Cadence()
    assert cadence(TrainConfig(checkpoint_every_seconds=None), 1).describe() == "checkpoints at epoch ends and on SIGTERM"


def test_several_workers_say_that_auto_cannot_save_by_time_and_refuse_a_number():
    plan = cadence(TrainConfig(), num_workers=2)
    assert plan.seconds is None and plan.steps is None
    assert plan.note.startswith("train.checkpoint_every_seconds=auto saves by time on one process only")
    assert cadence(TrainConfig(checkpoint_every_steps=4), num_workers=2) == Cadence(steps=4)
    with pytest.raises(ConfigError, match=r"^train\.checkpoint_every_seconds: .* use train\.checkpoint_every_steps"):
        cadence(TrainConfig(checkpoint_every_seconds=60), num_workers=2)


class FakeClock:
    """Each save "takes" the seconds given: the clock advances that much between two reads."""

    def __init__(self, seconds_per_save: float) -> None:
        self.now, self.per_save, self.reads = 0.0, seconds_per_save, 0

    def __call__(self) -> float:
        self.reads += 1
        if self.reads % 2 == 0:
            self.now += self.per_save
        return self.now


def checkpointer(tmp_path, plan: Cadence, seconds_per_save: float):
    step = tf.Variable(0, dtype=tf.int64)
    files = RunFiles(str(tmp_path), resolve(ClusterConfig()), tf.train.Checkpoint(step=step), max_to_keep=2)
    saver = TimedCheckpointer(files, TrainState(), 100, plan=plan, printer=lambda line: None,
                              clock=FakeClock(seconds_per_save))
    saver.model = type("Model", (), {"optimizer": type("Optimizer", (), {"iterations": step})()})()
    return saver, step


@pytest.mark.parametrize("seconds_per_save, interval", [
    (0.05, AUTO_CHECKPOINT_SECONDS),  # a demo's save: the interval stays
    (3.0, 3.0 * (1 - AUTO_MAX_SAVE_SHARE) / AUTO_MAX_SAVE_SHARE),  # a large model's: 147 s, saving 2% of the time
])
def test_a_slow_save_stretches_the_auto_interval_so_saving_stays_under_its_share(tmp_path, seconds_per_save, interval):
    saver, step = checkpointer(tmp_path, cadence(TrainConfig(), 1), seconds_per_save)
    step.assign(7)
    saver.save("every 60 s")
    assert saver.every_seconds == pytest.approx(interval)
    assert saver.saves == 1 and saver.periodic_seconds == saver.save_seconds == pytest.approx(seconds_per_save)
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-7")
    saver.save("every 60 s")  # the same step again: nothing written, nothing counted
    assert saver.saves == 1


def test_an_explicit_interval_is_never_stretched(tmp_path):
    saver, step = checkpointer(tmp_path, Cadence(seconds=10.0), seconds_per_save=3.0)
    step.assign(3)
    saver.save("every 10 s")
    assert saver.every_seconds == 10.0


def test_train_saves_between_epoch_ends_by_default(tmp_path, monkeypatch):
    """The default reaches the training loop: with the auto interval made 0 (and no stretching), every
    step of the epoch is saved, and metrics.json says what the saves cost."""
    from tpu_pipeline.train import train

    monkeypatch.setattr(cadence_module, "AUTO_CHECKPOINT_SECONDS", 1e-9)
    monkeypatch.setattr(cadence_module, "AUTO_MAX_SAVE_SHARE", 1.0)
    raw = lm_config(converted(tmp_path, count=120), str(tmp_path / "run"), epochs=1, steps=4, eval_data=False)
    raw["cluster"] = {"cpu_replicas": 1}  # the cadence is the point, not replicas: 1 traces far faster than 8
    assert "checkpoint_every_seconds" not in raw["train"] and "checkpoint_every_steps" not in raw["train"]
    lines: list[str] = []
    metrics = train(config_from_dict(raw), printer=lines.append)
    saved = [int(m.group(1)) for m in (re.search(r"at step (\d+) \(every ", line) for line in lines) if m]
    assert saved == [1, 2, 3], lines  # step 4 is the epoch's end, saved as such
    assert 0 < metrics["step_checkpoint_seconds"] < metrics["checkpoint_seconds"] < metrics["train_seconds"]
