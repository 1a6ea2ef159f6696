"""The built-in demo, as one call: the demo data (written once) and a config pointing at it."""
from __future__ import annotations

import os
from typing import Optional, Sequence

from tpu_pipeline.config import Config, load_config
from tpu_pipeline.records import ensure_demo_dataset

DEMO_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs_builtin", "demo.yaml")


def demo_overrides(cache_dir: Optional[str] = None, **dataset_args: int) -> list[str]:
    """Writes the demo set if needed; overrides that point the demo config's sources at it."""
    out_dir = ensure_demo_dataset(cache_dir, **dataset_args)
    return [f"data.source.dir={out_dir}", f"eval_data.source.dir={out_dir}"]


def demo_config(overrides: Sequence[str] = (), cache_dir: Optional[str] = None, **dataset_args: int) -> Config:
    """The demo config on the demo data, with your overrides (e.g. 'train.epochs=2') applied last."""
    return load_config(DEMO_CONFIG, demo_overrides(cache_dir, **dataset_args) + list(overrides))
