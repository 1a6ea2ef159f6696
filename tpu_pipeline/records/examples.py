"""Python and NumPy values → tf.train.Example features, and the feature spec that reads them back.

The spec written into metadata.json uses the config's own `data.features` format
(`{dtype: string|int64|float32, shape: [..], kind: fixed|var}`), so a pipeline config can take it
as is. Only three dtypes exist in a tf.Example; everything else is widened to one of them.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from tpu_pipeline.errors import DataError

DTYPES = ("int64", "float32", "string")


def spec(dtype: str, shape: Sequence[int] = (), kind: str = "fixed") -> dict[str, Any]:
    """One feature's entry in metadata.json (defaults left out, as a user would write it)."""
    entry: dict[str, Any] = {"dtype": dtype}
    if shape:
        entry["shape"] = [int(s) for s in shape]
    if kind != "fixed":
        entry["kind"] = kind
    return entry


def numpy_dtype_kind(dtype: np.dtype, where: str) -> str:
    """The tf.Example dtype that holds values of a NumPy dtype (bool and ints → int64, floats → float32)."""
    if dtype.kind in "biu":
        return "int64"
    if dtype.kind == "f":
        return "float32"
    if dtype.kind in "SU":
        return "string"
    raise DataError(
        f"{where}: dtype {dtype} cannot be stored in a tf.Example; use a numeric array or fixed-width "
        "strings (np.array(values, dtype=str))"
    )


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, np.bytes_):
        return bytes(value)
    return str(value).encode("utf-8")


def feature(value: Any, dtype: str) -> tf.train.Feature:
    """A scalar or array (any rank, flattened row-major) as one tf.train.Feature of `dtype`."""
    if dtype == "string":
        if isinstance(value, (str, bytes, np.str_, np.bytes_)):
            values = [_as_bytes(value)]
        else:
            values = [_as_bytes(v) for v in np.asarray(value).reshape(-1).tolist()]
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
    flat = np.asarray(value).reshape(-1)
    if dtype == "int64":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=flat.astype(np.int64).tolist()))
    if dtype == "float32":
        return tf.train.Feature(float_list=tf.train.FloatList(value=flat.astype(np.float32).tolist()))
    raise ValueError(f"unknown dtype {dtype!r}; one of {DTYPES}")


def serialize(features: Mapping[str, tf.train.Feature]) -> bytes:
    return tf.train.Example(features=tf.train.Features(feature=dict(features))).SerializeToString()


def class_ids(
    values: Iterable[str], class_names: Optional[Sequence[str]], where: str
) -> tuple[list[str], dict[str, int]]:
    """Class names (given, else the sorted distinct values) and the name → id map."""
    names = list(class_names) if class_names else sorted(set(values))
    if len(set(names)) != len(names):
        raise DataError(f"{where}: class names repeat: {names}")
    return names, {name: index for index, name in enumerate(names)}


def tf_error_reason(error: Exception) -> str:
    """The useful line of a TensorFlow error, without the `{{function_node ...}}` and `[Op:...]` noise."""
    text = getattr(error, "message", None) or str(error)
    text = text.splitlines()[0] if text else type(error).__name__
    if text.startswith("{{function_node"):
        text = text.split("}}", 1)[-1]
    return text.split(" [Op:")[0].strip()
