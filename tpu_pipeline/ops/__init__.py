"""Preprocessing ops: a registry plus the built-in image and label ops (imported to register them)."""
from tpu_pipeline.ops import image, label  # noqa: F401  (registers the built-in ops)
from tpu_pipeline.ops.registry import OpFn, RegisteredOp, get_op, register_op, registered_ops

__all__ = ["OpFn", "RegisteredOp", "get_op", "register_op", "registered_ops"]
