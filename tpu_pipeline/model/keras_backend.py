"""The one place that imports Keras: tf_keras by default, Keras 3 only when asked for.

tf_keras (Keras 2) is the Keras that works with TPUStrategy and with steps_per_execution > 1 under
a multi-replica MirroredStrategy; Keras 3.15 fails in fit there (measured; see the design notes).
Everything in `tpu_pipeline.model` gets its Keras module from `get_keras`, so the two never mix.
"""
from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Iterator

import tf_keras

from tpu_pipeline.errors import ConfigError

__all__ = ["tf_keras", "get_keras", "is_keras3", "global_policy"]


def get_keras(name: str = "tf_keras") -> ModuleType:
    """Returns the Keras module named by `model.keras` ('tf_keras' or 'keras3')."""
    if name == "tf_keras":
        return tf_keras
    if name != "keras3":
        raise ConfigError(f"model.keras: unknown Keras {name!r}; use 'tf_keras' (default) or 'keras3'")
    try:
        import keras  # Keras 3; imported only on request.
    except ImportError:  # pragma: no cover - keras ships with tensorflow
        raise ConfigError("model.keras: 'keras3' needs `pip install 'keras>=3'`; or use tf_keras") from None
    if not keras.__version__.startswith("3."):
        raise ConfigError(
            f"model.keras: 'keras3' found keras {keras.__version__}, not 3.x; install keras>=3 or use tf_keras"
        )
    if keras.backend.backend() != "tensorflow":
        raise ConfigError(
            f"model.keras: 'keras3' runs under tf.distribute only with the TensorFlow backend, but "
            f"KERAS_BACKEND is {keras.backend.backend()!r}; set KERAS_BACKEND=tensorflow or use tf_keras"
        )
    return keras


def is_keras3(keras: ModuleType) -> bool:
    return keras is not tf_keras


@contextlib.contextmanager
def global_policy(keras: ModuleType, name: str) -> Iterator[None]:
    """Sets Keras's process-wide dtype policy for the layers built inside, then restores the old one.

    Layers keep the policy they were built with, so restoring it stops one build (or test) from
    leaking mixed precision into the next.
    """
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)
