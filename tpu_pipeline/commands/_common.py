"""Helpers shared by the subcommands: config loading with the demo data wired in."""
from __future__ import annotations

from typing import Any, Sequence

from absl import flags

from tpu_pipeline.config import Config, config_from_dict
from tpu_pipeline.config.loader import apply_overrides, import_modules, read_yaml
from tpu_pipeline.demo import DEMO_CONFIG, demo_overrides

FLAGS = flags.FLAGS


def load_raw(overrides: Sequence[str]) -> tuple[dict[str, Any], Config]:
    """(the plain mapping, the validated Config): --config FILE + overrides, or the demo config on the demo data."""
    if FLAGS.config:
        raw = apply_overrides(read_yaml(FLAGS.config), overrides)
    else:
        raw = apply_overrides(read_yaml(DEMO_CONFIG), demo_overrides() + list(overrides))
    import_modules(raw.get("imports") or [])
    return raw, config_from_dict(raw)


def load(overrides: Sequence[str]) -> Config:
    """--config FILE + overrides; without --config, the built-in demo config on the demo data."""
    return load_raw(overrides)[1]
