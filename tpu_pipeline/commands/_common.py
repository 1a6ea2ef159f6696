"""Helpers shared by the subcommands: config loading with the demo data wired in."""
from __future__ import annotations

import os
from typing import Sequence

from absl import flags

from tpu_pipeline.config import Config, load_config
from tpu_pipeline.records import ensure_demo_dataset

FLAGS = flags.FLAGS
DEMO_CONFIG = os.path.join(os.path.dirname(__file__), "..", "configs_builtin", "demo.yaml")


def demo_overrides(cache_dir: str | None = None) -> list[str]:
    """Writes the demo set if needed and points the demo config's train/eval sources at it."""
    out_dir = ensure_demo_dataset(cache_dir)
    return [
        f"data.source.files={os.path.join(out_dir, 'train-*.tfrecord')}",
        f"eval_data.source.files={os.path.join(out_dir, 'validation-*.tfrecord')}",
    ]


def load(overrides: Sequence[str]) -> Config:
    """--config FILE + overrides; without --config, the built-in demo config on the demo data."""
    if FLAGS.config:
        return load_config(FLAGS.config, overrides)
    return load_config(DEMO_CONFIG, demo_overrides() + list(overrides))
