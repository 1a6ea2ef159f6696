"""A feature dict → the element Keras takes: (inputs, targets[, weights]) (`ToOutputs`); a windowed
pipeline's resume position is taken off here, or returned beside (`SplitPosition` where no outputs are set).
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Sequence, Union

import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.core.resume_position import split_position
from tpu_pipeline.pipeline.core.tuning import tune
from tpu_pipeline.pipeline.stages.base import Stage, StageContext

Features = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ToOutputs(Stage):
    """Feature dict → (inputs, targets) as Keras fit expects; a list of keys keeps a dict.

    A windowed pipeline's elements carry their resume position (`resume_position.POSITION_KEYS`); it is dropped,
    or with `position=True` (the package's own iterators) returned beside: (outputs, position).
    """

    roles: ClassVar[tuple[str, ...]] = ("outputs",)
    inputs: Union[str, Sequence[str]] = "image"
    targets: Union[str, Sequence[str], None] = "label"
    num_parallel_calls: Union[int, str, None] = None  # picking keys: no work worth a thread crossing
    position: bool = False
    # Feature(s) giving Keras's sample weights: (inputs, targets, weights). An integer feature weighs 1
    # where non-zero (segment ids, masks), a float one its value; several (an example mask [B] and a
    # token mask [B, L]) multiply, broadcast from the left.
    weights: Union[str, Sequence[str], None] = None

    def _pick(self, features: Features, keys: Union[str, Sequence[str]], what: str) -> Any:
        names = [keys] if isinstance(keys, str) else list(keys)
        missing = [k for k in names if k not in features]
        if missing:
            raise ConfigError(
                f"data.outputs.{what}: feature(s) {missing} do not exist; features here: {sorted(features)}"
            )
        return features[keys] if isinstance(keys, str) else {k: features[k] for k in names}

    def _weights(self, features: Features) -> tf.Tensor:
        names = [self.weights] if isinstance(self.weights, str) else list(self.weights)
        product = None
        for name in names:
            value = self._pick(features, name, "weights")
            value = tf.cast(value, tf.float32) if value.dtype.is_floating else tf.cast(value != 0, tf.float32)
            if product is not None:  # [B] times [B, L]: the example's weight on each of its tokens
                while value.shape.rank < product.shape.rank:
                    value = value[..., tf.newaxis]
                while product.shape.rank < value.shape.rank:
                    product = product[..., tf.newaxis]
                value = product * value
            product = value
        return product

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        def fn(features: Features):
            features, position = split_position(features)
            inputs = self._pick(features, self.inputs, "inputs")
            outputs = inputs if self.targets is None else (inputs, self._pick(features, self.targets, "targets"))
            if self.weights is not None:
                outputs = (*outputs, self._weights(features))
            return (outputs, position) if self.position and position else outputs

        calls = None if self.num_parallel_calls is None else tune(self.num_parallel_calls)
        return dataset.map(fn, num_parallel_calls=calls, name="to_outputs")


@dataclasses.dataclass(frozen=True)
class SplitPosition(Stage):
    """For a windowed pipeline without outputs: the position dropped from each feature dict, or with
    `position=True` returned beside it, as ToOutputs does."""

    roles: ClassVar[tuple[str, ...]] = ("outputs",)
    position: bool = False

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        def fn(features: Features):
            features, position = split_position(features)
            return (features, position) if self.position else features

        return dataset.map(fn, name="split_position")
