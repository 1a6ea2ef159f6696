"""The one map a record takes: parse, then the preprocess ops in order, fused so each element crosses
threads once; random ops get per-element seeds from the seed tree (tpu_pipeline.pipeline.core.seeds).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence, Union

import tensorflow as tf

from tpu_pipeline.ops.autograph_rule import users_code
from tpu_pipeline.ops.registry import OpFn
from tpu_pipeline.pipeline.core import seeds
from tpu_pipeline.pipeline.core.tuning import tune
from tpu_pipeline.pipeline.stages.base import Stage, StageContext

Features = dict[str, Any]


def parallel_map(dataset: tf.data.Dataset, fn: Callable, num_parallel_calls: Union[int, str],
                 deterministic: Optional[bool], name: str) -> tf.data.Dataset:
    """`dataset.map`, where one call at a time runs in the consumer's thread.

    A parallel map of one would hand every element to another thread and back, which costs more
    than a cheap function.
    """
    calls = tune(num_parallel_calls)
    if calls == 1:
        return dataset.map(fn, name=name)
    return dataset.map(fn, num_parallel_calls=calls, deterministic=deterministic, name=name)


@dataclasses.dataclass(frozen=True)
class MapFeatures(Stage):
    """One parallel map: optional parse, then ops in order. Fused so each element crosses threads once.

    `random_ops` lists which ops need a seed. When any does, the n-th element to enter this map on
    an input pipeline gets `seeds.element_seed(seed, "augment", pipeline, n)`, and op i gets
    `stateless_fold_in(element_seed, i)`: a pure function of a few integers. Seeds are given
    before the map, so its own thread timing and output order change nothing; a resumed pipeline
    passes `position`, the number of elements that entered before, so its seeds continue.
    """

    ops: Sequence[OpFn] = ()
    random_ops: Sequence[bool] = ()
    parse: Optional[Callable[[tf.Tensor], Features]] = None
    seed: int = 0
    num_parallel_calls: Union[int, str] = "autotune"
    deterministic: Optional[bool] = None
    name: str = "map_features"
    salted: bool = False  # on tf.data service workers: each worker folds its own salt into the element seeds
    purpose: str = seeds.AUGMENT  # the seed tree's branch (AUGMENT_BATCH for the batch-level ops after a Batch)

    def __post_init__(self) -> None:
        if self.random_ops and len(self.random_ops) != len(self.ops):
            raise ValueError("random_ops must have one flag per op")

    @property
    def needs_seed(self) -> bool:
        return any(self.random_ops)

    def transform(self, element: Any, element_seed: Optional[tf.Tensor] = None) -> Features:
        features = users_code(self.parse)(element) if self.parse is not None else dict(element)
        for index, op in enumerate(self.ops):
            seed = None
            if self.random_ops and self.random_ops[index]:
                seed = tf.random.experimental.stateless_fold_in(element_seed, index)
            features = users_code(op)(features, seed)
        return features

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        if not self.ops and self.parse is None:
            return dataset
        position = context.position
        if self.needs_seed and self.salted:
            pipeline = context.input_pipeline_id
            dataset = seeds.numbered_and_salted(dataset, position)
            fn = lambda element, position, salt: self.transform(  # noqa: E731
                element, seeds.element_seed(self.seed, self.purpose, pipeline, position, salt))
        elif self.needs_seed:
            pipeline = context.input_pipeline_id
            dataset = tf.data.Dataset.zip((dataset, seeds.positions(position)))
            fn = lambda element, position: self.transform(  # noqa: E731
                element, seeds.element_seed(self.seed, self.purpose, pipeline, position))
        else:
            fn = lambda element: self.transform(element)  # noqa: E731
        return parallel_map(dataset, fn, self.num_parallel_calls, self.deterministic, self.name)
