"""The cache stage: in memory, or to files keyed on everything upstream (`cache_key`)."""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import tensorflow as tf

from tpu_pipeline.pipeline.stages.base import Stage, StageContext
from tpu_pipeline.pipeline.stages.cache_key import check_cache_path, fingerprint, prepare_prefix
from tpu_pipeline.system import local_path


@dataclasses.dataclass(frozen=True)
class Cache(Stage):
    """Caches in memory ('' path) or to files; a file cache gets one prefix per input pipeline.

    `key`: a fingerprint of everything upstream (tpu_pipeline.pipeline.stages.cache_key), part of each
    prefix, so a changed config never replays another config's cache. `Cache.for_config` sets it.
    """

    roles: ClassVar[tuple[str, ...]] = ("cache",)
    path: str = ""
    key: str = ""
    where: str = "data.cache.path"  # the config key, for messages

    @classmethod
    def for_config(cls, config: Any, plan: Any, prefix: str = "data") -> "Cache":
        """The cache `config.cache` asks for, its path checked now (one-line ConfigError), keyed on the config."""
        where = f"{prefix}.cache.path"
        if not config.cache.path:
            return cls(where=where)
        check_cache_path(config.cache.path, where)
        return cls(local_path(config.cache.path), fingerprint(config, plan), where)

    def file_prefix(self, context: tf.distribute.InputContext) -> str:
        """`<path>/pipeline<i>-of-<n>.<key>`: TensorFlow adds .index, .data-*, _<shard>.lockfile."""
        name = f"pipeline{context.input_pipeline_id}-of-{context.num_input_pipelines}"
        return tf.io.gfile.join(self.path, f"{name}.{self.key}" if self.key else name)

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        if not self.path:
            return dataset.cache()
        tf.io.gfile.makedirs(self.path)
        prefix = self.file_prefix(context.input)
        prepare_prefix(prefix, self.where)
        return dataset.cache(prefix)
