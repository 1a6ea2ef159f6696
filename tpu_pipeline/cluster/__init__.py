"""Cluster resolver: finds the TPU (or GPUs, a TF_CONFIG cluster, the CPU) and returns its strategy.

Layering: this package knows only TensorFlow, `tpu_pipeline.errors`, `tpu_pipeline.tensorflow_install`
and `tpu_pipeline.config.cluster`; it never imports datasets, pipeline or Keras code.
"""
from tpu_pipeline.cluster.resolver import ClusterInfo, Kind, choose_kind, resolve
from tpu_pipeline.cluster.tpu import TfTpuBackend, TpuBackend, detect_local_tpu
from tpu_pipeline.cluster.tpu_stack import TensorFlowStack, current_stack

__all__ = ["ClusterInfo", "Kind", "TensorFlowStack", "TfTpuBackend", "TpuBackend", "choose_kind", "current_stack",
           "detect_local_tpu", "resolve"]
