"""Record order within an epoch: tf.data's shuffle buffer (`Shuffle`), or a vectorized permutation a
window at a time (`WindowShuffle`); seeds from the tree (tpu_pipeline.pipeline.core.seeds), per epoch.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Union

import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.core import seeds
from tpu_pipeline.pipeline.stages.base import Stage, StageContext
from tpu_pipeline.pipeline.stages.map_features import parallel_map


@dataclasses.dataclass(frozen=True)
class Shuffle(Stage):
    """tf.data's shuffle buffer; its seed is the tree's (seed, "shuffle", pipeline), folded with the
    epoch when `reshuffle_each_iteration` (else every epoch gets the same order)."""

    buffer_size: int = 10_000
    seed: int = 0
    reshuffle_each_iteration: bool = True

    @property
    def uses_epoch(self) -> bool:
        return self.reshuffle_each_iteration

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        fold = context.epoch if self.reshuffle_each_iteration else None
        seed = seeds.scalar(seeds.key(self.seed, seeds.SHUFFLE, context.input_pipeline_id, fold))
        with seeds.without_global_seed():
            return dataset.shuffle(self.buffer_size, seed=seed, reshuffle_each_iteration=self.reshuffle_each_iteration)


@dataclasses.dataclass(frozen=True)
class WindowShuffle(Stage):
    """Shuffles serialized records a window at a time: `window` records, one vectorized permutation.

    Why: `Dataset.shuffle` costs ~0.8 µs per element here, as much as reading the record, and it is
    per element however small. A window gathers records (single ones, or the blocks a source
    yields) into one vector, permutes it with one `gather`, and passes it on whole, so the cost is
    per window. Every record of a window leaves in a uniformly random position within it; unlike a
    streaming buffer, records do not cross window boundaries. Use it before a `Batch(records=True)`.

    Window w's permutation seed is the tree's (seed, "window_shuffle", pipeline) with the epoch
    (when `reshuffle_each_iteration`) and w folded in: a fixed seed gives the same windows on every
    run, new ones each epoch.
    """

    window: int = 10_000
    seed: int = 0
    reshuffle_each_iteration: bool = True
    num_parallel_calls: Union[int, str] = "auto"
    deterministic: Optional[bool] = None

    @property
    def uses_epoch(self) -> bool:
        return self.reshuffle_each_iteration

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        spec = dataset.element_spec
        # int64: record indices (a mixture's sources over its record cache), shuffled as their records would be.
        if not isinstance(spec, tf.TensorSpec) or spec.dtype not in (tf.string, tf.int64) or spec.shape.rank not in (0, 1):
            raise ConfigError(
                f"data.shuffle.mode=window shuffles serialized records (a string scalar or vector per element), "
                f"but this dataset yields {spec}; use data.shuffle.mode=stream"
            )
        windows = dataset.batch(self.window) if spec.shape.rank == 0 else dataset.rebatch(self.window)
        fold = context.epoch if self.reshuffle_each_iteration else None
        root = seeds.key(self.seed, seeds.WINDOW_SHUFFLE, context.input_pipeline_id, fold)
        windows = tf.data.Dataset.zip((seeds.positions(), windows))

        def permute(index: tf.Tensor, records: tf.Tensor) -> tf.Tensor:
            window_seed = tf.random.experimental.stateless_fold_in(root, index)
            order = tf.random.experimental.stateless_shuffle(tf.range(tf.shape(records)[0]), seed=window_seed)
            return tf.gather(records, order)

        return parallel_map(windows, permute, self.num_parallel_calls, self.deterministic, "window_shuffle")
