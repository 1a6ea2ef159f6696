"""The `train` config section: how long to train, where the run lives, what to log and save."""
from __future__ import annotations

from typing import Literal, Optional, Union

import pydantic

from tpu_pipeline.config.base import StrictModel
from tpu_pipeline.config.tasks import TaskName

# train.checkpoint_every_seconds: auto. A SIGKILL loses at most this many seconds of steps; a save
# that takes longer than AUTO_MAX_SAVE_SHARE of that stretches the interval so that saving never takes
# more than that share of the time (a large model saved to gs://). Measured on the demos:
# benchmarks/bench_checkpoints.py, docs/training.md.
AUTO_CHECKPOINT_SECONDS = 60.0
AUTO_MAX_SAVE_SHARE = 0.02


class TrainConfig(StrictModel):
    task: TaskName = pydantic.Field(
        "classification", description="classification: one label per example; language_model: next-token "
        "prediction, a loss and token accuracy per target token weighted by data.outputs.weights"
    )
    run_dir: str = pydantic.Field(
        "runs/demo", description="checkpoints, TensorBoard logs and metrics.json; reuse it to resume"
    )
    epochs: pydantic.PositiveInt = 10
    steps_per_epoch: Optional[pydantic.PositiveInt] = pydantic.Field(
        None, description="None: the number of full global batches in one pass over the training data"
    )
    eval_steps: Optional[pydantic.PositiveInt] = pydantic.Field(None, description="None: the whole eval set")
    eval_every_epochs: pydantic.PositiveInt = 1
    num_classes: Optional[pydantic.PositiveInt] = pydantic.Field(
        None, description="None: from the dataset's metadata (class_names)"
    )
    max_checkpoints: pydantic.PositiveInt = pydantic.Field(3, description="checkpoints kept (the newest)")
    checkpoint_every_steps: Optional[pydantic.PositiveInt] = pydantic.Field(
        None, description="also save every this many steps (besides each epoch end and SIGTERM); a resume "
        "continues from the newest checkpoint's step, input position included"
    )
    checkpoint_every_seconds: Union[pydantic.PositiveFloat, Literal["auto"], None] = pydantic.Field(
        "auto", description="also save when this many seconds passed since the last save (one process only); "
        f"auto: every {AUTO_CHECKPOINT_SECONDS:g} s, or longer when a save takes over {AUTO_MAX_SAVE_SHARE:.0%} of "
        "that, on one process and unless checkpoint_every_steps is set; null: epoch ends and SIGTERM only"
    )
    log_every_steps: pydantic.PositiveInt = 10
    tensorboard: bool = True
    profile_steps: Optional[tuple[pydantic.PositiveInt, pydantic.PositiveInt]] = pydantic.Field(
        None, description="[first, last] training step to trace with the TensorFlow profiler"
    )
    seed: Optional[int] = pydantic.Field(None, description="seeds TF's global random state (model init)")
    input_stall_seconds: Optional[pydantic.PositiveFloat] = pydantic.Field(
        300.0, description="end the run, with a line saying which stage or source is stuck, when the training "
        "input answers no request for a batch this long (a stream that yields nothing never ends by itself); a "
        "SIGTERM or Ctrl-C while it answers none ends the run at once; null: wait for ever"
    )
    allow_changes: list[str] = pydantic.Field(
        [], description="keys that may differ from what the checkpoint in run_dir was trained with (e.g. "
        "[data.source.dir, data.source.split] to fine-tune on other data), or sections of them (data, model); "
        "unlisted, a resume with another data source, sequence shape, global batch, model or task is refused"
    )

    @pydantic.field_validator("allow_changes")
    @classmethod
    def _check_allow_changes(cls, value: list[str]) -> list[str]:
        from tpu_pipeline.config.identity import IDENTITY_KEYS, check_allowed_names
        from tpu_pipeline.errors import ConfigError

        unknown = check_allowed_names(value)
        if unknown is not None:
            sections = sorted({key.rsplit(".", 1)[0] for key in IDENTITY_KEYS if key.count(".") > 1})
            raise ConfigError(
                f"train.allow_changes: {unknown!r} is not a key a resume compares; name the keys its refusal names, "
                f"or a section of them: data, model, train, {', '.join(sections)}, data.batch_size, train.task, "
                "train.num_classes"
            )
        return value

    @pydantic.model_validator(mode="after")
    def _check_profile(self) -> "TrainConfig":
        if self.profile_steps and self.profile_steps[0] > self.profile_steps[1]:
            from tpu_pipeline.errors import ConfigError

            raise ConfigError(f"train.profile_steps: first step must not be after the last, got {list(self.profile_steps)}")
        return self
