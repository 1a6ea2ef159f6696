"""`tpu-pipeline train [--config FILE] [key=value ...]`: train, evaluate, checkpoint, resume.

Without --config it trains the built-in demo (shapes images, written once into the cache).
"""
from __future__ import annotations

from typing import Sequence

from tpu_pipeline.commands._common import load


def run(overrides: Sequence[str]) -> int:
    from tpu_pipeline.train import train  # after flags are parsed: imports Keras

    train(load(overrides))
    return 0
