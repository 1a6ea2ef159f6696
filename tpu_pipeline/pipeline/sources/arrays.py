"""In-memory arrays as a source (the classic tutorials' `from_tensor_slices`), or an .npz file's."""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Mapping, Optional

import numpy as np
import tensorflow as tf

from tpu_pipeline.errors import DataError
from tpu_pipeline.format import DatasetInfo
from tpu_pipeline.pipeline.sources.base import Source
from tpu_pipeline.pipeline.sources.sharding import choose_sharding
from tpu_pipeline.system import local_path


@dataclasses.dataclass(frozen=True)
class ArraySource(Source):
    """In-memory arrays (the classic tutorials' from_tensor_slices): an equal slice per input
    pipeline ('auto'), or every n-th element ('element')."""

    in_memory: ClassVar[bool] = True
    arrays: Mapping[str, np.ndarray]
    sharding: str = "auto"

    @classmethod
    def from_npz(cls, path: str, sharding: str = "auto") -> "ArraySource":
        path = local_path(path)
        if not tf.io.gfile.exists(path):
            raise DataError(f"data.source.path: {path!r} does not exist")
        with tf.io.gfile.GFile(path, "rb") as handle:
            loaded = np.load(handle)
            return cls(arrays={k: loaded[k] for k in loaded.files}, sharding=sharding)

    def info(self) -> DatasetInfo:
        lengths = {len(value) for value in self.arrays.values()}
        features = {key: list(np.shape(value)[1:]) for key, value in self.arrays.items()}
        return DatasetInfo(lengths.pop() if len(lengths) == 1 else None, None, features)

    def _mode(self, context: tf.distribute.InputContext) -> str:
        return choose_sharding(self.sharding, 0, context.num_input_pipelines, balanced=True)

    def epoch_length(self, context: tf.distribute.InputContext) -> Optional[int]:
        total = self.info().num_examples
        if total is None:
            return None
        pipelines, index = context.num_input_pipelines, context.input_pipeline_id
        mode = self._mode(context)
        if mode == "none":
            return total
        if mode == "balanced":
            return total // pipelines
        return -(-(total - index) // pipelines)  # element: every n-th, starting at this pipeline's index

    def build(self, context: tf.distribute.InputContext, epoch: Optional[tf.Tensor] = None) -> tf.data.Dataset:
        lengths = {key: len(value) for key, value in self.arrays.items()}
        if len(set(lengths.values())) != 1:
            raise DataError(f"in-memory arrays differ in their first dimension: {lengths}; they must all be equal")
        mode = self._mode(context)
        if mode == "balanced":
            # An equal, contiguous slice per input pipeline; the last N mod n elements are left out.
            length = self.epoch_length(context)
            low = context.input_pipeline_id * length
            return tf.data.Dataset.from_tensor_slices({k: v[low:low + length] for k, v in self.arrays.items()})
        dataset = tf.data.Dataset.from_tensor_slices(dict(self.arrays))
        if mode == "element":
            dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        return dataset
