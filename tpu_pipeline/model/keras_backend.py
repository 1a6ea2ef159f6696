"""The one place that imports Keras: tf_keras by default, Keras 3 only when asked for.

tf_keras (Keras 2) is the Keras that works with TPUStrategy and with steps_per_execution > 1 under
a multi-replica MirroredStrategy; Keras 3.15 fails in fit there (measured; see the design notes).
Everything in `tpu_pipeline.model` gets its Keras module from `get_keras`, so the two never mix.

The framework (`model.framework`) is decided here too, from the config and KERAS_BACKEND
(`config.framework.choose_framework`): Keras 3 reads that variable once, at its first import, so the choice must be
made, and the variable set, before anything imports `keras` (`use_framework`).
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
import warnings
from types import ModuleType
from typing import Iterator, Optional

import tf_keras

from tpu_pipeline.config.framework import BACKEND_VARIABLE, choose_framework
from tpu_pipeline.errors import ConfigError

__all__ = ["tf_keras", "get_keras", "is_keras3", "global_policy", "choose_framework", "use_framework",
           "build_for_input"]


def use_framework(framework: str) -> None:
    """Makes Keras 3 run on `framework`'s backend (jax: KERAS_BACKEND=jax), before anything of ours uses it.

    `import tensorflow` already imports Keras 3 with the backend KERAS_BACKEND named then (TensorFlow when
    unset), so a `model.framework: jax` that came from the config switches it with Keras's own
    `keras.config.set_backend`, which re-imports Keras: Keras objects made before (in a notebook) belong to
    the old one.
    """
    if framework != "jax":
        return
    if importlib.util.find_spec("jax") is None:
        raise ConfigError("model.framework: jax needs JAX: pip install -e \".[jax]\" (on a TPU VM add \"jax[tpu]\"; "
                          "docs/training.md, 'Which backend')")
    os.environ[BACKEND_VARIABLE] = "jax"
    if "keras" not in sys.modules:
        return  # the first import of Keras 3 reads the variable
    import keras

    if keras.backend.backend() != "jax":
        logging.getLogger(__name__).info("model.framework jax: Keras 3 was imported with the %s backend; switching it "
                                         "to jax (keras.config.set_backend)", keras.backend.backend())
        with warnings.catch_warnings():  # its warning says what the docstring above says
            warnings.simplefilter("ignore", UserWarning)
            keras.config.set_backend("jax")


def get_keras(name: str = "tf_keras", framework: Optional[str] = None) -> ModuleType:
    """Returns the Keras module named by `model.keras` ('tf_keras' or 'keras3'), on `framework`'s backend
    (None: tensorflow unless KERAS_BACKEND says jax)."""
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
    if framework is None:
        framework = "jax" if keras.backend.backend() == "jax" else "tensorflow"
    if framework == "jax":
        if keras.backend.backend() != "jax":
            raise ConfigError(f"model.framework is jax, but Keras 3 was imported with the {keras.backend.backend()} "
                              f"backend; set {BACKEND_VARIABLE}=jax before Python starts")
        return keras
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


def build_for_input(model: object, element_spec: object) -> None:
    """Builds a Keras 3 model's compiled loss and metrics from the input's element spec, before `fit`.

    Otherwise Keras 3's `fit` builds them from a first batch taken through an iterator of its own and then
    starts the real one: the input pipeline runs that batch twice, and a windowed pipeline's position log
    (`PositionLog`, which counts the elements taken) runs one batch ahead of the steps, so a resume would
    repeat it (measured on both backends: a packed run killed and resumed trained on other documents from
    its resumed step on). A `tf.distribute` dataset's spec is per replica (`PerReplicaSpec`): one replica's
    is the batch Keras builds from. On the TensorFlow backend the build runs in the strategy's scope
    (`_maybe_symbolic_build`), and that method takes a batch from `fit`'s iterator even when everything is
    built, so once built it is replaced on this model by a no-op. tf_keras builds lazily inside its step
    and needs nothing.
    """
    if getattr(model, "_symbolic_build", None) is None:
        return  # tf_keras
    import keras
    import tensorflow as tf

    in_scope = getattr(model, "_maybe_symbolic_build", None)  # Keras 3's TF trainer
    build = in_scope or (model._symbolic_build if keras.backend.backend() == "jax" else None)  # type: ignore[attr-defined]
    if build is None:
        return  # a Keras 3 whose TF trainer builds another way: left to it

    def symbolic(spec: object) -> object:
        replicas = getattr(spec, "_value_specs", None)  # a PerReplicaSpec: every replica's spec is alike
        spec = replicas[0] if replicas else spec
        return keras.KerasTensor(tuple(spec.shape), spec.dtype.name) if isinstance(spec, tf.TensorSpec) else spec

    build(data_batch=tf.nest.map_structure(symbolic, element_spec))
    if in_scope is not None:
        model._maybe_symbolic_build = _built_already  # type: ignore[attr-defined]


def _built_already(iterator: object = None, data_batch: object = None) -> None:
    """Keras 3's TF trainer's `_maybe_symbolic_build` on a model `build_for_input` built: nothing to build,
    and no batch to take."""
