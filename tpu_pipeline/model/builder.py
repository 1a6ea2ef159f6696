"""`build_model`: the network, optimizer, schedule, loss and metrics, compiled under a strategy.

The model layer receives the strategy, the accelerator kind and the input spec from its caller;
it never reads data or finds devices itself (pipeline and cluster are other layers).
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, Optional, Sequence, Union

import tensorflow as tf

from tpu_pipeline.config.model import ModelConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.model.architectures import build_network
from tpu_pipeline.model.user_models import ModelFn
from tpu_pipeline.model.keras_backend import choose_framework, get_keras, global_policy, is_keras3, use_framework
from tpu_pipeline.model.optimizers import build_optimizer
from tpu_pipeline.model.precision import check_kind, resolve_precision
from tpu_pipeline.model.schedules import build_schedule
from tpu_pipeline.model.tasks import Task, task_named

logger = logging.getLogger(__name__)

TPU_STEPS_PER_EXECUTION = 32  # Enough host→TPU round trips saved; small enough for responsive logs.


def resolve_steps_per_execution(config: ModelConfig, kind: str, num_replicas: int,
                                steps_per_epoch: Optional[int]) -> int:
    """'auto' → 32 on TPU (at most steps_per_epoch), else 1; guards the Keras 3 failure.

    Keras 3.15 with several replicas and steps_per_execution > 1 fails inside fit (measured under
    MirroredStrategy; TPUStrategy has open reports). An explicit value is refused with a
    ConfigError; 'auto' falls back to 1 with a warning.
    """
    check_kind(kind)
    value = config.steps_per_execution
    explicit = value != "auto"
    if not explicit:
        value = TPU_STEPS_PER_EXECUTION if kind == "tpu" else 1
    if steps_per_epoch is not None and value > steps_per_epoch:
        # More steps per call than an epoch has would make Keras truncate anyway; say so.
        if explicit:
            logger.warning("model.steps_per_execution=%d exceeds steps_per_epoch=%d; using %d",
                           value, steps_per_epoch, steps_per_epoch)
        value = max(1, steps_per_epoch)
    if config.keras == "keras3" and config.framework != "jax" and value > 1 and (num_replicas > 1 or kind == "tpu"):
        if explicit:
            raise ConfigError(
                f"model.steps_per_execution: {value} with model.keras=keras3 and {num_replicas} replicas "
                f"({kind}) fails inside Keras 3's fit; use model.keras: tf_keras (recommended on TPU) "
                "or model.steps_per_execution: 1"
            )
        logger.warning(
            "model.keras=keras3 with %d replicas (%s): steps_per_execution 'auto' set to 1 instead of "
            "%d, because Keras 3 fails in fit with more; use model.keras: tf_keras for the speed-up",
            num_replicas, kind, value,
        )
        value = 1
    if config.framework == "jax" and steps_per_epoch and value > 1 and steps_per_epoch % value:
        value = _dividing(config, int(value), steps_per_epoch, explicit)
    return int(value)


def _dividing(config: ModelConfig, value: int, steps_per_epoch: int, explicit: bool) -> int:
    """On JAX, the largest count of steps per execution that divides an epoch: Keras 3.15's JAX trainer runs
    every execution whole, so 2 per execution over a 7-step epoch trains 8 steps, past the epoch's end and
    the step its checkpoint says (measured). A resumed epoch starts at a saved step, an execution's end."""
    divisor = max(d for d in range(1, value + 1) if steps_per_epoch % d == 0)
    if explicit:
        raise ConfigError(
            f"model.steps_per_execution={value} does not divide train.steps_per_epoch={steps_per_epoch}: on JAX each "
            f"execution runs all its steps, so epochs would overrun; use {divisor} or a steps_per_epoch it divides")
    logger.info("model.steps_per_execution 'auto': %d on JAX (the largest that divides the %d steps of an epoch; "
                "%d does not)", divisor, steps_per_epoch, value)
    return divisor


def build_model(
    config: ModelConfig,
    *,
    strategy: tf.distribute.Strategy,
    kind: str,
    input_shape: Union[Sequence[Optional[int]], Mapping[str, Sequence[Optional[int]]]],
    num_classes: int,
    steps_per_epoch: Optional[int],
    epochs: int,
    model_fn: Optional[ModelFn] = None,
    task: Union[str, Task] = "classification",
    byte_offset: Optional[int] = None,
) -> Any:
    """Builds and compiles the configured model inside `strategy.scope()`.

    Args:
      config: the `model` config section.
      strategy: from the cluster layer; variables are created under its scope.
      kind: 'tpu' | 'gpu' | 'cpu' | 'multi-worker'; picks precision and steps_per_execution.
      input_shape: one example's shape without the batch dimension, e.g. [32, 32, 3] or [16]; for
        several inputs (token ids with segment ids and positions) a dict of them by input name.
      num_classes: width of the logits (a language model's: the vocabulary size).
      steps_per_epoch: training steps per epoch (sizes the schedule); None only with a constant
        schedule without warm-up.
      epochs: training epochs (the schedule ends at the last one).
      model_fn: your model, fn(input_shape=..., num_classes=...) -> an uncompiled Keras model that
        outputs logits; called inside the scope (overrides config.fn/application/architecture).
      task: 'classification' (a label per example) or 'language_model' (a target token per position,
        per-token weights; metrics token_accuracy, perplexity, and bits_per_byte with `byte_offset`), or
        a `model.tasks.Task` object; the task decides the loss and metrics (`Task.loss_and_metrics`).
      byte_offset: for byte-level token ids, the id of byte 0 (ids below it are special tokens).

    Returns:
      A compiled `tf_keras.Model` (a `keras.Model` when config.keras is 'keras3').
    """
    task = task_named(task)
    config = choose_framework(config)
    use_framework(config.framework)
    keras = get_keras(config.keras, config.framework)
    precision = resolve_precision(config.precision, kind)
    num_replicas = strategy.num_replicas_in_sync
    steps_per_execution = resolve_steps_per_execution(config, kind, num_replicas, steps_per_epoch)
    if is_keras3(keras) and kind == "tpu" and config.framework != "jax":
        logger.warning("model.keras=keras3 under TPUStrategy has open Keras issues; tf_keras is the tested path")
    if config.batch_norm.synchronized and num_replicas == 1 and config.architecture != "mlp":
        logger.info("model.batch_norm.synchronized with 1 replica is the same as plain batch norm")

    with global_policy(keras, precision), strategy.scope():
        model = build_network(keras, config, input_shape, num_classes, model_fn, task=task)
        schedule = build_schedule(keras, config.schedule, steps_per_epoch, epochs)
        optimizer = build_optimizer(keras, config.optimizer, schedule)
        loss, metrics = task.loss_and_metrics(keras, config, byte_offset)
        model.compile(
            optimizer=optimizer, loss=loss, weighted_metrics=metrics, steps_per_execution=steps_per_execution
        )
    if kind == "multi-worker" and not is_keras3(keras):
        # tf_keras's "auto" reduction sums each logged metric over the workers, though every worker
        # already holds the all-reduced value: 2 workers logged accuracy 0.87 for 0.43.
        model.distribute_reduction_method = "first"
    logger.info(
        "model %s: %d parameters, %s, precision %s, steps_per_execution %d, %d replica(s) (%s)",
        model.name, model.count_params(), "Keras 3 on JAX" if config.framework == "jax" else keras.__name__,
        precision, steps_per_execution,
        num_replicas, kind,
    )
    return model
