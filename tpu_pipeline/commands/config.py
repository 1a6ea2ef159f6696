"""`tpu-pipeline config [--config FILE ...] [--params_override ...] [--set_only] [key=value ...]`.

Prints the fully resolved config: files layered, overrides applied, every default filled in. What
`train` would run, before it runs. With `--set_only`, only the keys that were set: a file that
`--config` takes back (the full print also shows keys the chosen options do not use, which a
config may not set).
"""
from __future__ import annotations

from typing import Sequence

import yaml
from absl import flags

from tpu_pipeline.commands._common import load

flags.DEFINE_boolean("set_only", False, "print only the keys set by files and overrides (a reusable --config file)")
FLAGS = flags.FLAGS


def run(overrides: Sequence[str]) -> int:
    config = load(overrides)
    resolved = config.model_dump(mode="json", exclude_unset=FLAGS.set_only)
    if not FLAGS.set_only:
        print("# the resolved config, every default filled in (--set_only prints a file --config takes back)")
    print(yaml.safe_dump(resolved, sort_keys=False, width=100).rstrip())
    return 0
