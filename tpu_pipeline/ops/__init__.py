"""Preprocessing ops: a registry plus the built-in image, augmentation, label and token-sequence ops (imported to
register them).

`check_ops(data)` checks the ops a data config names without calling a factory (no TensorFlow);
factories run, and may use TensorFlow, when a pipeline is built (`build_ops`, `RegisteredOp.build`).
`keyed` writes an op as a function of one tensor; `scoped_ops` undoes registrations (for tests).
"""
from tpu_pipeline.ops import erasing, image, label, mixing, randaugment, token_ops  # noqa: F401  (registers the ops)
from tpu_pipeline.ops.check import build_ops, check_ops, split_batch_level
from tpu_pipeline.ops.keyed import keyed
from tpu_pipeline.ops.registry import OpFn, RegisteredOp, get_op, register_op, registered_ops, scoped_ops

__all__ = [
    "OpFn", "RegisteredOp", "build_ops", "check_ops", "get_op", "keyed", "register_op", "registered_ops",
    "scoped_ops", "split_batch_level",
]
