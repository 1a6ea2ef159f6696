"""tpu_pipeline: fast, composable tf.data input pipelines and strategy helpers for Keras on Cloud TPU.

The public API, kept small (see README):
  load_config, Config, DataConfig        typed configs with key=value overrides
  Pipeline, build_dataset                stages composed per tf.distribute.InputContext
  register_op                            add your own preprocessing op, usable by name in configs
  check_tpu_compatible                   static shapes and TPU dtypes, checked before training
  TpuPipelineError and subclasses        every error a user can cause
"""
from tpu_pipeline.config import Config, DataConfig, load_config
from tpu_pipeline.errors import (
    ClusterError, ConfigError, DataError, TpuCompatibilityError, TpuPipelineError,
)
from tpu_pipeline.ops import register_op
from tpu_pipeline.pipeline import Pipeline, build_dataset, check_tpu_compatible

__version__ = "0.1.0"

__all__ = [
    "ClusterError", "Config", "ConfigError", "DataConfig", "DataError", "Pipeline",
    "TpuCompatibilityError", "TpuPipelineError", "build_dataset", "check_tpu_compatible",
    "load_config", "register_op",
]
