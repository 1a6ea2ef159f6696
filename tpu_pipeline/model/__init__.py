"""Keras models from config, built and compiled under a `tf.distribute` strategy.

Public entry: `build_model`. tf_keras is the default Keras (`keras_backend.tf_keras`); callers that
need Keras objects (callbacks, saving) should take them from `get_keras` so they match the model.
This layer never imports the data pipeline or the cluster code.
"""
from tpu_pipeline.model.architectures import build_network
from tpu_pipeline.model.builder import build_model, resolve_steps_per_execution
from tpu_pipeline.model.keras_backend import get_keras, global_policy, tf_keras
from tpu_pipeline.model.optimizers import build_optimizer
from tpu_pipeline.model.precision import KINDS, resolve_precision
from tpu_pipeline.model.schedules import build_schedule

__all__ = [
    "KINDS",
    "build_model",
    "build_network",
    "build_optimizer",
    "build_schedule",
    "get_keras",
    "global_policy",
    "resolve_precision",
    "resolve_steps_per_execution",
    "tf_keras",
]
