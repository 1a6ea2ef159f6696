"""Which framework a training job runs on: the decision, its cluster, and the Keras-specific callbacks.

`model.framework` (or KERAS_BACKEND) is decided before anything imports Keras 3; the cluster is resolved for
it (a tf.distribute strategy, or a keras.distribution over JAX's devices); the rest of the job is one code.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import tensorflow as tf

from tpu_pipeline.cluster import ClusterInfo, resolve
from tpu_pipeline.config import Config
from tpu_pipeline.config.framework import choose_framework
from tpu_pipeline.errors import ConfigError, PeerFailure
from tpu_pipeline.model import get_keras, tf_keras
from tpu_pipeline.model.keras_backend import use_framework
from tpu_pipeline.pipeline.checks.record_check import tf_message

Printer = Callable[[str], None]

# What a TensorFlow collective raises when a peer worker died or hung up.
_TF_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.InternalError, tf.errors.AbortedError,
                   tf.errors.DeadlineExceededError, tf.errors.CancelledError)
# In a JAX runtime error's text when a peer process died: its collective's connection (Gloo on CPU) or
# the coordination service (a status code a lost peer gives).
_JAX_PEER_MARKS = ("gloo", "connection reset", "connection refused", "broken pipe", "unavailable:",
                   "deadline_exceeded", "aborted:", "cancelled:", "heartbeat", "socket closed")


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


def peer_errors(cluster: ClusterInfo) -> tuple[type[BaseException], ...]:
    """The exception types a step may raise when a peer host died: TensorFlow's collectives', and on JAX
    its runtime error too (a Gloo all-reduce whose peer hung up raises it at once)."""
    if cluster.framework == "jax":
        import jax

        return _TF_PEER_ERRORS + (jax.errors.JaxRuntimeError,)
    return _TF_PEER_ERRORS


def is_peer_failure(error: BaseException, cluster: ClusterInfo) -> bool:
    """Whether `error` (one of `peer_errors`) means a peer host is gone: only with several hosts, and on JAX
    only a runtime error that says so (another, such as running out of device memory, is the step's own)."""
    if cluster.num_workers == 1:
        return False
    if isinstance(error, _TF_PEER_ERRORS):
        return True
    text = str(error).lower()
    return any(mark in text for mark in _JAX_PEER_MARKS)


def peer_failure(cause: BaseException | str, latest_checkpoint: Optional[str]) -> PeerFailure:
    """The one line of a peer host's death: what the collective said (or what `PeerWatch` saw), and the
    command that resumes."""
    said = (cause if isinstance(cause, str) else  # TF's first line says little
            tf_message(cause, limit=300, marks=("aborted by", "unhealthy", "connect")))
    return PeerFailure(f"a peer worker stopped or cannot be reached ({said}); start every worker again with the same "
                       f"command: the run resumes from {latest_checkpoint or 'its start (no checkpoint yet)'}")
