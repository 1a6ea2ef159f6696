"""A serialized tf.Example (or tf.SequenceExample) against a config's feature spec, in plain Python:
what does not fit, and the fix.

Shared by the build-time check of the pipeline (one record) and `verify` (every record), so both
name the same faults the same way. Also home of `feature_spec`, the spec `tf.io.parse_*example` takes.

Records are SequenceExamples when any feature is of kind `sequence` (a feature list); the other
features are then the SequenceExample's context. The two protos share field 1 (features /
context), so each parses as the other without complaint: which one a record is meant to be comes
from the spec, never from a guess, and a feature looked for in the wrong place gets a fix saying so.

Token features (`is_token_feature`: integer ids of kind ragged or sequence) get a fix of their own
for a wrong dtype, and `token_ids` reads their ids for `verify`'s vocabulary and empty-document checks.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional, Union

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError

from tpu_pipeline.config.data import LOSS_WEIGHTS, WEIGHTED_TOKENS

DTYPES = {"string": tf.string, "int64": tf.int64, "float32": tf.float32}
_KINDS = {"bytes_list": "string", "int64_list": "int64", "float_list": "float32"}
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1

Record = Union[tf.train.Example, tf.train.SequenceExample]
TOKEN_KINDS = ("ragged", "sequence")  # variable-length lists: what token ids are stored as


def is_sequence_spec(features: Mapping[str, Any]) -> bool:
    """Whether records are SequenceExamples: any feature of kind `sequence`."""
    return any(feature.kind == "sequence" for feature in features.values())


def _spec(name: str, feature: Any) -> Any:
    dtype = DTYPES[feature.dtype]
    if feature.kind == "var":
        return tf.io.VarLenFeature(dtype)
    if feature.kind == "ragged":  # no partitions: one 1-D vector per example (a [B, None] RaggedTensor in a batch)
        return tf.io.RaggedFeature(dtype, value_key=name)
    if feature.kind == "sequence":  # absent: an error at parse, unless default: [] says it is an empty sequence
        return tf.io.FixedLenSequenceFeature(feature.shape, dtype, allow_missing=feature.default is not None)
    return tf.io.FixedLenFeature(feature.shape, dtype, default_value=feature.default)


def feature_spec(features: Mapping[str, Any]) -> dict[str, Any]:
    """FeatureConfig mapping → the dict tf.io.parse_*example expects (context and feature lists together
    for SequenceExamples: `sequence_spec` splits them)."""
    return {name: _spec(name, feature) for name, feature in features.items()}


def sequence_spec(features: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(context features, sequence features): the two specs tf.io.parse_*sequence_example takes."""
    spec = feature_spec(features)
    context = {name: s for name, s in spec.items() if features[name].kind != "sequence"}
    return context, {name: s for name, s in spec.items() if features[name].kind == "sequence"}


@dataclasses.dataclass(frozen=True)
class Misfit:
    kind: str  # 'not_an_example' | 'missing_feature' | 'wrong_dtype' | 'wrong_shape'
    key: Optional[str]  # the feature's name
    what: str
    fix: str


def _decoded(proto: Any, record: bytes) -> Any:
    """`proto` filled from `record`; None when the bytes do not decode as it."""
    try:
        proto.ParseFromString(record)
    except DecodeError:
        return None
    return proto


def parse_example(record: bytes) -> Optional[tf.train.Example]:
    return _decoded(tf.train.Example(), record)


def parse_sequence_example(record: bytes) -> Optional[tf.train.SequenceExample]:
    return _decoded(tf.train.SequenceExample(), record)


def parse_record(record: bytes, features: Mapping[str, Any]) -> Optional[Record]:
    """`record` as the proto `features` describes (a SequenceExample when any feature is a sequence);
    None when it does not decode."""
    return parse_sequence_example(record) if is_sequence_spec(features) else parse_example(record)


def is_token_feature(feature: Any) -> bool:
    """Token ids: an integer list of any length (kind ragged or sequence). A fixed-length integer
    (a label, an id) is not one, so it never meets a vocabulary check."""
    return feature.kind in TOKEN_KINDS and feature.dtype == "int64"


def token_ids(record: Record, name: str, feature: Any) -> Optional[np.ndarray]:
    """The int64 ids `record` stores under `name` (a feature list's steps one after another); None when
    the feature is absent, empty when it holds none. Dtypes are `misfit`'s job: other lists read as empty.
    An array, not a list: min and max over it cost a quarter as much (verify reads every record)."""
    if feature.kind == "sequence":
        lists = record.feature_lists.feature_list if isinstance(record, tf.train.SequenceExample) else {}
        if name not in lists:
            return None
        steps = [np.asarray(step.int64_list.value, np.int64) for step in lists[name].feature]
        return np.concatenate(steps) if steps else np.zeros([0], np.int64)
    stored = context_features(record)
    return np.asarray(stored[name].int64_list.value, np.int64) if name in stored else None


def context_features(record: Record) -> Any:
    """The features map of an Example, or the context of a SequenceExample."""
    return record.context.feature if isinstance(record, tf.train.SequenceExample) else record.features.feature


def misfit(record: Union[bytes, Record], features: Mapping[str, Any]) -> Optional[Misfit]:
    """The first way `record` (serialized, or already parsed) does not fit `features`, None when it fits."""
    sequence = is_sequence_spec(features)
    want = tf.train.SequenceExample if sequence else tf.train.Example
    if isinstance(record, (tf.train.Example, tf.train.SequenceExample)) and not isinstance(record, want):
        record = record.SerializeToString()  # the same bytes read as the other proto
    example = record if isinstance(record, want) else parse_record(record, features)
    if example is None:
        name = "tf.train.SequenceExample" if sequence else "tf.train.Example"
        return Misfit("not_an_example", None, f"not a {name}",
                      "was the file written by something else (raw bytes, another proto)?")
    stored = context_features(example)
    lists = example.feature_lists.feature_list if sequence else {}
    for name, feature in features.items():
        if feature.kind == "sequence":
            found = _sequence_misfit(name, feature, lists, stored)
        else:
            found = _feature_misfit(name, feature, stored, example, sequence)
        if found is not None:
            return found
    return None


def _weights_form_fix(name: str, stored: Any) -> Optional[str]:
    """The fix where a config reads loss weights in the other form than the records hold them: inside the tokens
    (`weighted_tokens`, what `convert --from chat` writes) or beside them (`tokens` + `loss_weights`)."""
    if name == WEIGHTED_TOKENS and LOSS_WEIGHTS in stored:
        return ("these records hold their loss weights beside the tokens ('tokens' and 'loss_weights', as chat sets "
                "were converted before 'weighted_tokens'): read features {tokens, loss_weights} with {op: lm_shift, "
                "key: tokens}, or convert them again (convert --from chat)")
    if name in ("tokens", LOSS_WEIGHTS) and WEIGHTED_TOKENS in stored:
        return ("these records hold each token's loss weight inside it ('weighted_tokens', 2 * id + weight, as "
                "convert --from chat writes): read features {weighted_tokens} with {op: lm_shift, key: "
                "weighted_tokens}")
    return None


def _feature_misfit(name: str, feature: Any, stored: Any, example: Record, sequence: bool) -> Optional[Misfit]:
    if name not in stored:
        if feature.kind == "var" or feature.default is not None:
            return None
        present = ", ".join(sorted(stored)) or "none"
        where = "context feature" if sequence else "feature"
        fix = "rename the key, or give it a default (or kind: var) if some records lack it"
        if feature.kind == "ragged":
            fix = "rename the key, or set default: [] if some records lack it (they are then empty sequences)"
        if not sequence and isinstance(example, tf.train.Example):
            as_sequence = parse_sequence_example(example.SerializeToString())
            if as_sequence is not None and name in as_sequence.feature_lists.feature_list:
                fix = (f"the records are tf.train.SequenceExamples with a feature list {name!r}: set kind: sequence "
                       "(the other features are then read from the context)")
        fix = _weights_form_fix(name, stored) or fix
        return Misfit("missing_feature", name, f"has no {where} {name!r} (it has: {present})", fix)
    kind = stored[name].WhichOneof("kind")
    if kind is None:
        return None  # an empty feature: nothing to compare
    values = getattr(stored[name], kind).value
    found = _values_misfit(name, feature, kind, values)
    if found is not None:
        return found
    if feature.kind == "fixed":
        count, expected = len(values), math.prod(feature.shape)
        if count != expected:
            return Misfit("wrong_shape", name,
                          f"holds {count} value(s) where shape is {list(feature.shape)} ({expected} value(s))",
                          f"set shape: [{count}] (or a shape of {count} values), or kind: var (or ragged) when the "
                          "length varies")
    return None


def _values_misfit(name: str, feature: Any, kind: str, values: Any, step: str = "") -> Optional[Misfit]:
    """The stored list's dtype against the spec, and int64 ids against int32 when they arrive as int32."""
    dtype = _KINDS[kind]
    if dtype != feature.dtype:
        fix = f"set dtype: {dtype} (then cast in preprocess if the model needs another type)"
        if is_token_feature(feature):  # ids stored as floats or bytes: the record is wrong, not the spec
            fix = "token ids are int64 lists: convert this record again, writing its ids as int64"
        return Misfit("wrong_dtype", name, f"stores {dtype} values{step} where dtype is {feature.dtype}", fix)
    if getattr(feature, "parsed_dtype", feature.dtype) == "int32" and feature.dtype == "int64" and len(values):
        ids = np.asarray(values, np.int64)  # min and max over an array: a fifth of the time over the proto's list
        low, high = int(ids.min()), int(ids.max())
        if low < INT32_MIN or high > INT32_MAX:
            bad = low if low < INT32_MIN else high
            return Misfit("wrong_dtype", name, f"holds the id {bad}{step}, outside int32, which it is parsed as",
                          "set cast: int64 on the feature (ids then arrive as int64)")
    return None


def _sequence_misfit(name: str, feature: Any, lists: Any, context: Any) -> Optional[Misfit]:
    if name not in lists:
        if feature.default is not None:
            return None
        present = ", ".join(sorted(lists)) or "none"
        fix = "rename the key, or set default: [] if some records lack it (they are then empty sequences)"
        if name in context:
            fix = f"{name!r} is a context feature (or the records are tf.Examples): use kind ragged (or fixed, var)"
        return Misfit("missing_feature", name, f"has no feature list {name!r} (its feature lists: {present})", fix)
    expected = math.prod(feature.shape)
    for index, step in enumerate(lists[name].feature):
        kind = step.WhichOneof("kind")
        values = getattr(step, kind).value if kind is not None else []
        if kind is not None:
            found = _values_misfit(name, feature, kind, values, f" at step {index}")
            if found is not None:
                return found
        if len(values) != expected:
            return Misfit("wrong_shape", name,
                          f"holds {len(values)} value(s) at step {index} where shape is {list(feature.shape)} "
                          f"({expected} value(s) a step)",
                          f"set shape: [{len(values)}] if every step holds {len(values)}; steps of different lengths "
                          "cannot be parsed as one tensor")
    return None
