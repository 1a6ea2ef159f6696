"""The `cluster` config section: which accelerator to use and how to reach it.

Every key is optional: the default (`accelerator: auto`) finds a TPU, then a TF_CONFIG cluster,
then GPUs, then the CPU, so the same config runs on a TPU VM, in Colab and on a laptop.
Keys that only make sense for one accelerator are refused when another one is asked for, so a
setting is never silently ignored.
"""
from __future__ import annotations

from typing import Literal

import pydantic

from tpu_pipeline.config.base import StrictModel

Accelerator = Literal["auto", "tpu", "gpu", "cpu", "multi_worker"]


class ClusterConfig(StrictModel):
    """Where to train. Read by `tpu_pipeline.cluster.resolve`."""

    accelerator: Accelerator = pydantic.Field(
        "auto",
        description="auto: TPU, then TF_CONFIG with several workers, then GPUs, then CPU. "
        "tpu: a TPU or an error listing every attempt.",
    )
    tpu: str | None = pydantic.Field(
        None,
        description="TPU name, 'grpc://host:8470' address, or 'local' (TPU VM). "
        "None: TPU_NAME, COLAB_TPU_ADDR, then a TPU attached to this VM.",
    )
    tpu_zone: str | None = pydantic.Field(None, description="GCP zone of a named TPU; default TPU_ZONE.")
    tpu_project: str | None = pydantic.Field(
        None, description="GCP project of a named TPU; default TPU_PROJECT."
    )
    cpu_replicas: int = pydantic.Field(
        1,
        ge=1,
        description="CPU only: >1 splits the CPU into this many logical devices under a "
        "MirroredStrategy (tests, laptops); 1 is the default strategy.",
    )
    gpus: list[int] | None = pydantic.Field(
        None,
        min_length=1,
        description="GPU only: indices into the visible GPUs (after CUDA_VISIBLE_DEVICES); "
        "None uses them all.",
    )

    coordinator_address: str | None = pydantic.Field(
        None, description="model.framework jax with several processes: host:port of process 0's jax.distributed "
        "coordinator (with num_processes and process_id). None: JAX_COORDINATOR_ADDRESS, or a multi-host TPU "
        "slice's own environment, else one process",
    )
    num_processes: int | None = pydantic.Field(None, ge=1, description="model.framework jax: processes in all")
    process_id: int | None = pydantic.Field(None, ge=0, description="model.framework jax: this process, 0 first")

    @pydantic.field_validator("tpu", "tpu_zone", "tpu_project")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        """An empty string would make TF guess the TPU from the environment: say so instead."""
        if value is not None and not value.strip():
            raise ValueError("must not be empty; leave the key out (null) to auto-detect")
        return value.strip() if value is not None else None

    @pydantic.field_validator("tpu")
    @classmethod
    def _tpu_needs_tpu(cls, value: str | None, info: pydantic.ValidationInfo) -> str | None:
        accelerator = info.data.get("accelerator", "auto")
        if value is not None and accelerator not in ("auto", "tpu"):
            raise ValueError(f"a TPU is named but accelerator is {accelerator!r}; set accelerator: tpu or drop tpu")
        return value

    @pydantic.field_validator("cpu_replicas")
    @classmethod
    def _cpu_replicas_need_cpu(cls, value: int, info: pydantic.ValidationInfo) -> int:
        accelerator = info.data.get("accelerator", "auto")
        if value > 1 and accelerator not in ("auto", "cpu"):
            raise ValueError(f"only applies to the CPU but accelerator is {accelerator!r}; set accelerator: cpu")
        return value

    @pydantic.field_validator("gpus")
    @classmethod
    def _gpus_valid(cls, value: list[int] | None, info: pydantic.ValidationInfo) -> list[int] | None:
        if value is None:
            return value
        accelerator = info.data.get("accelerator", "auto")
        if accelerator not in ("auto", "gpu"):
            raise ValueError(f"only applies to GPUs but accelerator is {accelerator!r}; set accelerator: gpu")
        if any(index < 0 for index in value):
            raise ValueError("GPU indices must be >= 0")
        if len(set(value)) != len(value):
            raise ValueError("GPU indices must not repeat")
        return value
