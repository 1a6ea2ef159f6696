"""Helpers shared by the subcommands: config loading with the demo data wired in."""
from __future__ import annotations

from typing import Sequence

from absl import flags

from tpu_pipeline.config import Config, load_config
from tpu_pipeline.demo import demo_config

FLAGS = flags.FLAGS


def load(overrides: Sequence[str]) -> Config:
    """--config FILE + overrides; without --config, the built-in demo config on the demo data."""
    if FLAGS.config:
        return load_config(FLAGS.config, overrides)
    return demo_config(overrides)
