"""Resolves `model.precision` per accelerator kind: bfloat16 where the hardware has it natively."""
from __future__ import annotations

from tpu_pipeline.errors import ConfigError

KINDS = ("tpu", "gpu", "cpu", "multi-worker")


def check_kind(kind: str) -> str:
    """`kind` comes from the cluster layer as a plain string; refuse anything else early."""
    if kind not in KINDS:
        raise ConfigError(f"kind: unknown accelerator kind {kind!r}; expected one of {', '.join(KINDS)}")
    return kind


def resolve_precision(precision: str, kind: str) -> str:
    """Maps 'auto' to mixed_bfloat16 on TPU and float32 elsewhere; refuses mixed_float16 off GPU.

    float16 needs loss scaling and only pays off on GPU tensor cores; TPUs compute in bfloat16, and
    on CPU float16 is slow, so mixed_float16 there is a mistake worth an error.
    """
    check_kind(kind)
    if precision == "auto":
        return "mixed_bfloat16" if kind == "tpu" else "float32"
    if precision == "mixed_float16" and kind in ("tpu", "cpu"):
        fix = "mixed_bfloat16 (or auto)" if kind == "tpu" else "float32 (or auto)"
        raise ConfigError(
            f"model.precision: mixed_float16 is for GPUs, but this run is on {kind}; use {fix}"
        )
    if precision not in ("float32", "mixed_bfloat16", "mixed_float16"):
        raise ConfigError(
            f"model.precision: unknown policy {precision!r}; use auto, float32, mixed_bfloat16 or mixed_float16"
        )
    return precision
