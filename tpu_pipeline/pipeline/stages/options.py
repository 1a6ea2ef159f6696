"""The one place that turns the config's options section into tf.data.Options (TF 2.16+ names), and
the stage that attaches them (`WithOptions`)."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from tpu_pipeline.config.data import OptionsConfig
from tpu_pipeline.pipeline.stages.base import Stage, StageContext

_SHARD_POLICIES = {
    "auto": tf.data.experimental.AutoShardPolicy.AUTO,
    "file": tf.data.experimental.AutoShardPolicy.FILE,
    "data": tf.data.experimental.AutoShardPolicy.DATA,
    "hint": tf.data.experimental.AutoShardPolicy.HINT,
    "off": tf.data.experimental.AutoShardPolicy.OFF,
}


def make_options(config: OptionsConfig) -> tf.data.Options:
    """Sets only what the config sets; None leaves TensorFlow's own default in place."""
    options = tf.data.Options()
    options.autotune.enabled = config.autotune
    if config.cpu_budget is not None:
        options.autotune.cpu_budget = config.cpu_budget
    if config.ram_budget is not None:
        options.autotune.ram_budget = config.ram_budget
    if config.private_threadpool_size is not None:
        options.threading.private_threadpool_size = config.private_threadpool_size
    if config.max_intra_op_parallelism is not None:
        options.threading.max_intra_op_parallelism = config.max_intra_op_parallelism
    if config.deterministic is not None:
        options.deterministic = config.deterministic
    if config.map_parallelization is not None:
        options.experimental_optimization.map_parallelization = config.map_parallelization
    if config.auto_shard_policy is not None:
        options.experimental_distribute.auto_shard_policy = _SHARD_POLICIES[config.auto_shard_policy]
    options.experimental_slack = config.slack
    return options


@dataclasses.dataclass(frozen=True)
class WithOptions(Stage):
    """Attaches tf.data.Options (`make_options` makes them from the config)."""

    roles: ClassVar[tuple[str, ...]] = ("options",)
    options: tf.data.Options

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        return dataset.with_options(self.options)
