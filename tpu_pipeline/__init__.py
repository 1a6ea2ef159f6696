"""tpu_pipeline: fast, composable tf.data input pipelines and strategy helpers for Keras on Cloud TPU.

The public API, kept small (see docs/api.md):
  load_config, Config, DataConfig        typed configs with key=value overrides
  Pipeline, build_dataset                stages composed per tf.distribute.InputContext
  register_op                            add your own preprocessing op, usable by name in configs
  check_tpu_compatible                   static shapes and TPU dtypes, checked before training
  TpuPipelineError and subclasses        every error a user can cause
"""
from typing import Any

from tpu_pipeline.tensorflow_install import prepare_tensorflow_import

# Before any module of ours imports TensorFlow: with no TPU on this machine (or a libtpu that does not
# match the TPU TensorFlow), TensorFlow starts without libtpu instead of hanging or aborting.
prepare_tensorflow_import()

from tpu_pipeline.errors import (  # noqa: E402
    ClusterError, ConfigError, DataError, TpuCompatibilityError, TpuPipelineError,
)

# Imported on first use (PEP 562): `import tpu_pipeline.cli` (the `tpu-pipeline` command, even
# `--help`) must not start TensorFlow before the command has silenced its start-up lines.
_LAZY = {
    "Config": "tpu_pipeline.config", "DataConfig": "tpu_pipeline.config", "load_config": "tpu_pipeline.config",
    "register_op": "tpu_pipeline.ops",
    "Pipeline": "tpu_pipeline.pipeline", "build_dataset": "tpu_pipeline.pipeline",
    "check_tpu_compatible": "tpu_pipeline.pipeline",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tpu_pipeline' has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "ClusterError", "Config", "ConfigError", "DataConfig", "DataError", "Pipeline",
    "TpuCompatibilityError", "TpuPipelineError", "build_dataset", "check_tpu_compatible",
    "load_config", "register_op",
]
