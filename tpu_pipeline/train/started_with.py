"""What a run directory was started with: kept in every checkpoint, compared when the run resumes.

The keys (`config.identity`) are the training data, the sequence shape, the global batch, the model
and the task. A resume whose config differs in one of them would go on training that checkpoint on
something else without a word; it is refused in one line naming the keys that differ and the two
ways on: a new `train.run_dir`, or `train.allow_changes=[...]` to continue with the change (fine-tuning
on other data). An accepted change is saved with the next checkpoint, so the run is from then on
what it was continued with. Checkpoints written before this record existed are not compared.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

import tensorflow as tf

from tpu_pipeline.config import Config
from tpu_pipeline.config.identity import accepts, differences, run_identity, show
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.sequences.modes.registry import sequence_mode

STARTED_WITH_KEY = "started_with"  # the checkpoint's string variable: the record below, as JSON


def record(config: Config, input_pipelines: int) -> dict[str, Any]:
    """What a checkpoint of this config keeps: the compared keys, train.epochs (free: a resume with more
    trains them) and the number of input pipelines (hosts) whose places its steps stand for."""
    return {"identity": run_identity(config), "epochs": config.train.epochs, "input_pipelines": input_pipelines}


def variable(config: Config, input_pipelines: int) -> tf.Variable:
    """The checkpoint's record of this config (assign it again after a restore: an accepted change then sticks)."""
    return tf.Variable(json.dumps(record(config, input_pipelines)), dtype=tf.string, trainable=False,
                       name=STARTED_WITH_KEY)


def saved_record(path: str) -> Optional[dict[str, Any]]:
    """The record in checkpoint `path`; None for a checkpoint written before records were kept."""
    reader = tf.train.load_checkpoint(path)
    key = f"{STARTED_WITH_KEY}/.ATTRIBUTES/VARIABLE_VALUE"
    if not reader.has_tensor(key):
        return None
    value = reader.get_tensor(key)
    return json.loads(value.decode() if isinstance(value, bytes) else str(value))


def check_resume(config: Config, latest: Optional[str]) -> list[str]:
    """Refuses (ConfigError) a resume of `latest` whose compared keys differ from this config's and are not
    in train.allow_changes; returns the lines to print about what differs and is accepted."""
    if latest is None:
        return []
    saved = saved_record(latest)
    if saved is None:
        return []
    changed = differences(saved["identity"], run_identity(config))
    run_dir = config.train.run_dir
    framework = [change for change in changed if change[0] == "model.framework"]
    if framework:  # the weights are saved by another Keras's names: no allow_changes can carry them over
        was = framework[0][1] or "tensorflow"
        raise ConfigError(
            f"train.run_dir={run_dir} holds a run trained on {was} (checkpoint {latest}), and this one runs on "
            f"{framework[0][2] or 'tensorflow'}; resume it on {was} (" + ("KERAS_BACKEND=jax or model.framework: jax"
            if was == "jax" else "unset KERAS_BACKEND and model.framework") + "), or start a new train.run_dir")
    allowed = config.train.allow_changes
    refused = [change for change in changed if not accepts(allowed, change[0])]
    said = lambda changes: ", ".join(f"{key} {show(old)} -> {show(new)}" for key, old, new in changes)  # noqa: E731
    if refused:
        keys = ",".join(key for key, _, _ in refused)
        raise ConfigError(
            f"train.run_dir={run_dir} holds a run started with other settings: {said(refused)} "
            f"(checkpoint {latest}); start a new run with another train.run_dir, or continue this one with the "
            f"change, e.g. to fine-tune, with train.allow_changes=[{keys}]"
        )
    lines = []
    if changed:
        lines.append(f"train.allow_changes: {run_dir} goes on from {os.path.basename(latest)} with {said(changed)}")
    if saved.get("epochs") is not None and config.train.epochs > saved["epochs"] and config.model.schedule.name == "cosine":
        lines.append(f"train.epochs={config.train.epochs} (the run was started with {saved['epochs']}): the cosine "
                     f"learning-rate schedule is laid out over {config.train.epochs} epoch(s), so it goes on at its "
                     "value for the resumed step on that curve")
    return lines


def check_hosts(config: Config, latest: Optional[str], input_pipelines: int) -> None:
    """Refuses a resume on another number of input pipelines (hosts) than wrote `latest` of a windowed stream
    whose mode can neither regroup its places nor deal its rows: none of today's (a new mode must say which).

    A stream of examples (of one source or a mixture) is dealt to the new hosts (`example_layout`), a
    bucketed one, which every host reads whole, regroups (`windowed_position`; scaled by tokens, skipping the
    examples its old groups held), and a packed one deals the rows its hosts had left (`packed_slice`,
    `mixed_slice`).
    Through data.service a resume starts a fresh job at an epoch's start whatever the hosts, so it goes on.
    Checkpoints written before the count was kept are not compared."""
    saved = saved_record(latest) if latest else None
    was = None if saved is None else saved.get("input_pipelines")
    data = config.data
    if was is None or was == input_pipelines or data is None or data.service.enabled:
        return
    sequence = data.sequence
    mode = sequence_mode(sequence.mode) if sequence is not None else None
    if mode is None or mode.regroups_on_another_slice(sequence.bucket_batch) or mode.deals_rows_on_another_slice():
        return  # bucket: every host reads the whole stream, its places regroup; pack: its rows are dealt (packed_slice)
    raise ConfigError(
        f"train.run_dir={config.train.run_dir}: {latest} was written by {hosts(was)} (input pipelines) and this run "
        f"has {hosts(input_pipelines)}; a data.sequence {sequence.mode} stream resumes exactly only on as many, since "
        f"each host's place is in windows of its own (docs/resume.md): resume it on {hosts(was)}, or start a new "
        "train.run_dir"
    )


def hosts(count: int) -> str:
    """'1 host', '2 hosts'."""
    return f"{count} host{'s' if count != 1 else ''}"
