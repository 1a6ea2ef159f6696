"""The built-in demo, as one call: the demo data (written once) and a config pointing at it."""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence

from tpu_pipeline.cluster.resolver import split_cpu_early
from tpu_pipeline.config import Config, load_config
from tpu_pipeline.config.framework import choose_framework
from tpu_pipeline.records import ensure_demo_dataset
from tpu_pipeline.records.demo_chat import CHAT_DEMO_DIR, ensure_chat_demo
from tpu_pipeline.records.demo_text import CODE_DEMO_DIR, TEXT_DEMO_DIR, ensure_code_demo, ensure_text_demo
from tpu_pipeline.system import local_path

DEMO_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs_builtin", "demo.yaml")


def demo_overrides(cache_dir: Optional[str] = None, **dataset_args: int) -> list[str]:
    """Writes the demo set if needed; overrides that point the demo config's sources at it."""
    out_dir = ensure_demo_dataset(cache_dir, **dataset_args)
    return [f"data.source.dir={out_dir}", f"eval_data.source.dir={out_dir}"]


def demo_config(overrides: Sequence[str] = (), cache_dir: Optional[str] = None, **dataset_args: int) -> Config:
    """The demo config on the demo data, with your overrides (e.g. 'train.epochs=2') applied last.

    cluster.cpu_replicas > 1 among them splits the CPU first: writing the demo data runs TensorFlow ops,
    after which the CPU could no longer be split for `train`."""
    first = load_config(DEMO_CONFIG, list(overrides))
    if choose_framework(first.model).framework == "tensorflow":
        split_cpu_early(first.cluster)
    return load_config(DEMO_CONFIG, demo_overrides(cache_dir, **dataset_args) + list(overrides))


def ensure_builtin_data(raw: dict[str, Any]) -> None:
    """Writes the text (or code) demo where a config's data or eval_data source, or a source of its
    mixture, points at it (a directory ending in demo_text/v1, demo_code/v2 or demo_chat/v2, as
    configs/text_lm.yaml's, configs/text_lm_mixture.yaml's and configs/chat_sft.yaml's do) and it is not there yet: such a config trains with no data of
    yours, on any machine."""
    for section in ("data", "eval_data"):
        data = raw.get(section) or {}
        mixture = data.get("mixture") if isinstance(data, dict) else None
        entries = (mixture or {}).get("sources") if isinstance(mixture, dict) else None
        sources = [data.get("source") if isinstance(data, dict) else None]
        sources += [entry.get("source") for entry in entries or [] if isinstance(entry, dict)]
        for source in sources:
            directory = source.get("dir") if isinstance(source, dict) else None
            if isinstance(directory, str) and "://" not in directory:
                path = os.path.normpath(local_path(directory))
                for name, ensure in ((TEXT_DEMO_DIR, ensure_text_demo), (CODE_DEMO_DIR, ensure_code_demo),
                                     (CHAT_DEMO_DIR, ensure_chat_demo)):
                    if path.endswith(os.sep + name):
                        ensure(out_dir=path)
