"""A serialized tf.Example against a config's feature spec, in plain Python: what does not fit, and the fix.

Shared by the build-time check of the pipeline (one record) and `verify` (every record), so both
name the same faults the same way. Also home of `feature_spec`, the spec `tf.io.parse_*example` takes.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional, Union

import tensorflow as tf
from google.protobuf.message import DecodeError

DTYPES = {"string": tf.string, "int64": tf.int64, "float32": tf.float32}
_KINDS = {"bytes_list": "string", "int64_list": "int64", "float_list": "float32"}


def feature_spec(features: Mapping[str, Any]) -> dict[str, Any]:
    """FeatureConfig mapping → the dict tf.io.parse_*example expects."""
    spec: dict[str, Any] = {}
    for name, feature in features.items():
        dtype = DTYPES[feature.dtype]
        if feature.kind == "var":
            spec[name] = tf.io.VarLenFeature(dtype)
        else:
            spec[name] = tf.io.FixedLenFeature(feature.shape, dtype, default_value=feature.default)
    return spec


@dataclasses.dataclass(frozen=True)
class Misfit:
    kind: str  # 'not_an_example' | 'missing_feature' | 'wrong_dtype' | 'wrong_shape'
    key: Optional[str]  # the feature's name
    what: str
    fix: str


def parse_example(record: bytes) -> Optional[tf.train.Example]:
    example = tf.train.Example()
    try:
        example.ParseFromString(record)
    except DecodeError:
        return None
    return example


def misfit(record: Union[bytes, tf.train.Example], features: Mapping[str, Any]) -> Optional[Misfit]:
    """The first way `record` (serialized, or already parsed) does not fit `features`, None when it fits."""
    example = record if isinstance(record, tf.train.Example) else parse_example(record)
    if example is None:
        return Misfit("not_an_example", None, "not a tf.train.Example",
                      "was the file written by something else (raw bytes, a SequenceExample)?")
    stored = example.features.feature
    for name, feature in features.items():
        if name not in stored:
            if feature.kind == "var" or feature.default is not None:
                continue
            present = ", ".join(sorted(stored)) or "none"
            return Misfit("missing_feature", name, f"has no feature {name!r} (it has: {present})",
                          "rename the key, or give it a default (or kind: var) if some records lack it")
        kind = stored[name].WhichOneof("kind")
        if kind is None:
            continue  # an empty feature: nothing to compare
        dtype = _KINDS[kind]
        if dtype != feature.dtype:
            return Misfit("wrong_dtype", name, f"stores {dtype} values where dtype is {feature.dtype}",
                          f"set dtype: {dtype} (then cast in preprocess if the model needs another type)")
        if feature.kind == "fixed":
            count, expected = len(getattr(stored[name], kind).value), math.prod(feature.shape)
            if count != expected:
                return Misfit("wrong_shape", name,
                              f"holds {count} value(s) where shape is {list(feature.shape)} ({expected} value(s))",
                              f"set shape: [{count}] (or a shape of {count} values), or kind: var when the length varies")
    return None
