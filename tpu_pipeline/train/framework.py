"""Which framework a training job runs on: the decision, its cluster, and the Keras-specific callbacks.

`model.framework` (or KERAS_BACKEND) is decided before anything imports Keras 3; the cluster is resolved for
it (a tf.distribute strategy, or a keras.distribution over JAX's devices); the rest of the job is one code.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from tpu_pipeline.cluster import ClusterInfo, resolve
from tpu_pipeline.config import Config
from tpu_pipeline.config.framework import choose_framework
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.model import get_keras, tf_keras
from tpu_pipeline.model.keras_backend import use_framework

Printer = Callable[[str], None]


def framework_and_cluster(config: Config, cluster: Optional[ClusterInfo]) -> tuple[Config, ClusterInfo]:
    """The config with model.framework decided (config, else KERAS_BACKEND), Keras set to it, and the cluster
    of that framework: a tf.distribute strategy, or a keras.distribution over JAX's devices."""
    model = choose_framework(config.model)
    if model is not config.model:
        config = config.model_copy(update={"model": model})
    use_framework(model.framework)
    cluster = cluster or resolve(config.cluster, framework=model.framework)
    if cluster.framework != model.framework:
        raise ConfigError(f"model.framework is {model.framework}, but the cluster passed in was resolved for "
                          f"{cluster.framework}; resolve it with framework={model.framework!r} or leave it out")
    return config, cluster


def tensorboard_callback(config: Config, cluster: ClusterInfo, log_dir: str, printer: Printer) -> Any:
    """Keras's TensorBoard callback of the model's Keras; the profiler only on TensorFlow (JAX has its own)."""
    profile = tuple(config.train.profile_steps) if config.train.profile_steps else 0
    if cluster.framework != "jax":
        return tf_keras.callbacks.TensorBoard(log_dir, profile_batch=profile)
    if profile:
        printer("train.profile_steps: TensorBoard's profiler traces TensorFlow steps; on JAX it is left off "
                "(use jax.profiler)")
    return get_keras(config.model.keras, "jax").callbacks.TensorBoard(log_dir)
