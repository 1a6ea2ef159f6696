"""The prefetch at the end of a pipeline: the buffer that lets the accelerator not wait."""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Union

import tensorflow as tf

from tpu_pipeline.pipeline.core.tuning import tune
from tpu_pipeline.pipeline.stages.base import Stage, StageContext


@dataclasses.dataclass(frozen=True)
class Prefetch(Stage):
    roles: ClassVar[tuple[str, ...]] = ("prefetch",)
    buffer_size: Union[int, str] = "autotune"

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        if self.buffer_size == 0:
            return dataset
        return dataset.prefetch(tune(self.buffer_size))
