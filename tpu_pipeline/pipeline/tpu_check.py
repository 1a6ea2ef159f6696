"""Is a dataset fit for a TPU? Fully static shapes and dtypes XLA on TPU takes, checked up front.

A TPU compiles one program per input shape: a dynamic dimension (often a last partial batch)
fails or recompiles deep inside `fit`. Strings cannot be fed at all, and int64/float64 are not
native. We name each offending feature, its spec and the fix before training starts.
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional

import tensorflow as tf

from tpu_pipeline.errors import TpuCompatibilityError

TPU_DTYPES = frozenset({tf.float32, tf.bfloat16, tf.int32, tf.uint32, tf.bool, tf.int8, tf.uint8, tf.complex64})

_DTYPE_FIX = {
    tf.string: "strings cannot go to a TPU: decode them (e.g. op decode_image) or drop them (op keep)",
    tf.int64: "cast it to int32 (op: {op: cast, key: NAME, dtype: int32})",
    tf.float64: "cast it to float32 or bfloat16 (op: {op: cast, key: NAME, dtype: float32})",
    tf.float16: "TPUs compute in bfloat16: cast it with {op: cast, key: NAME, dtype: bfloat16}",
    tf.uint16: "cast it to int32 (op: {op: cast, key: NAME, dtype: int32})",
    tf.int16: "cast it to int32 (op: {op: cast, key: NAME, dtype: int32})",
}


SEQUENCE_FIX = "give the token sequence a static length: data.sequence: {keys: [NAME], length: N, mode: pad|bucket|pack}"


def _walk(spec: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(spec, dict):
        for key in sorted(spec):
            yield from _walk(spec[key], f"{path}.{key}" if path else str(key))
    elif isinstance(spec, (tuple, list)):
        names = ("inputs", "targets", "sample_weights") if not path and len(spec) <= 3 else None
        for index, item in enumerate(spec):
            yield from _walk(item, names[index] if names else f"{path}[{index}]")
    else:
        yield path or "<element>", spec


def tpu_problems(element_spec: Any, feature_names: Optional[Mapping[str, str]] = None) -> list[str]:
    """One readable line per feature a TPU cannot take; empty when the dataset is fit.

    `feature_names`: the feature behind each position of an (inputs, targets) element, e.g.
    {"targets": "label"}, so that a suggested op names a key that exists."""
    problems = []
    for name, spec in _walk(element_spec, ""):
        short = (feature_names or {}).get(name) or name.split(".")[-1].split("[")[0]
        tokens = (isinstance(spec, (tf.TensorSpec, tf.SparseTensorSpec, tf.RaggedTensorSpec))
                  and spec.dtype.is_integer and spec.shape.rank == 2)  # [batch, length]: a token sequence
        if isinstance(spec, (tf.SparseTensorSpec, tf.RaggedTensorSpec)):
            fix = (SEQUENCE_FIX.replace("NAME", short) if tokens else
                   "densify and pad it to a fixed length (FixedLenFeature, or pad in a preprocessing op)")
            problems.append(f"feature '{name}' is {type(spec).__name__} {spec}: TPUs need dense tensors; {fix}")
            continue
        if not isinstance(spec, tf.TensorSpec):
            problems.append(f"feature '{name}' has spec {spec!r}, which is not a dense tensor")
            continue
        if not spec.shape.is_fully_defined():
            dims = [i for i, d in enumerate(spec.shape.as_list() if spec.shape.rank is not None else [None]) if d is None]
            fix = (
                "batch with drop_remainder=true (data.drop_remainder) so every batch has the same size"
                if dims == [0]
                else SEQUENCE_FIX.replace("NAME", short) if tokens and dims == [1]
                else "give it a fixed size (e.g. op resize / center_crop for images, or a fixed-length feature)"
            )
            problems.append(f"feature '{name}' has dynamic shape {spec.shape} (dtype {spec.dtype.name}): {fix}")
        if spec.dtype not in TPU_DTYPES:
            fix = _DTYPE_FIX.get(spec.dtype, "cast it to float32, bfloat16 or int32").replace("NAME", short)
            problems.append(f"feature '{name}' has dtype {spec.dtype.name} (shape {spec.shape}): {fix}")
    return problems


def check_tpu_compatible(dataset_or_spec: Any, feature_names: Optional[Mapping[str, str]] = None) -> None:
    """Raises TpuCompatibilityError naming every feature a TPU cannot take (call it on CPU too)."""
    spec = dataset_or_spec.element_spec if isinstance(dataset_or_spec, tf.data.Dataset) else dataset_or_spec
    problems = tpu_problems(spec, feature_names)
    if problems:
        raise TpuCompatibilityError("dataset is not fit for a TPU:\n  " + "\n  ".join(problems))
