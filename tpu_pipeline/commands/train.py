"""`tpu-pipeline train [--config FILE] [key=value ...]`: train, evaluate, checkpoint, resume.

Without --config it trains the built-in demo (shapes images, written once into the cache).
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

from tpu_pipeline.commands._common import load


_run_dir: Optional[str] = None  # the running config's train.run_dir, for `interrupted`


def run(overrides: Sequence[str]) -> int:
    global _run_dir
    from tpu_pipeline.train import train  # after flags are parsed: imports Keras

    config = load(overrides, check_accelerator=True)  # a TPU this TF cannot drive: one line, before the demo data
    _run_dir = config.train.run_dir
    train(config)
    return 0


def interrupted() -> str:
    """What a Ctrl-C kept (the CLI prints it as one line): the newest checkpoint, from which the same
    command resumes; the steps trained after it are trained again."""
    if _run_dir is None:
        return ""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(os.path.join(_run_dir, "checkpoints"))
    if latest is None:
        return (f"no checkpoint was saved yet, nothing kept in {_run_dir}; the same command starts the run again "
                "from step 0")
    step = latest.rsplit("-", 1)[-1]
    at = f" (step {step})" if step.isdigit() else ""
    return (f"the last checkpoint, {latest}{at}, is kept; run the same command again to resume from it "
            "(steps trained after it are trained again)")
