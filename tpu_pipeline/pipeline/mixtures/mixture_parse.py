"""A mixture whose sources differ: each source's records parsed with its own spec and run through its own
ops, then stitched back in the mixed order, so the stages after see one shape.

Every mixed record comes with its source beside it (`mixed_records`), so which source a record came
from is known before any parse. Then:

- on a vector of records (the batched parse): each source's records are gathered, parsed and run
  through its ops as one batch, and the groups are put back in the records' order with one gather
  per feature;
- on one record: `tf.switch_case` on its source picks its parse and ops.

Either way the sources must end with the same features, of the same dtypes: a source that does not is
named in one line (its features against the first source's).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.core.element_keys import RECORDS_KEY, SOURCE_KEY
from tpu_pipeline.pipeline.stages.parse import make_parser

Features = dict[str, Any]


def _signature(features: Mapping[str, Any]) -> dict[str, str]:
    """Each feature's kind and dtype, e.g. {'tokens': 'RaggedTensor int32'}."""
    specs = {key: tf.type_spec_from_value(value) for key, value in features.items()}
    return {key: f"{type(spec).__name__.replace('Spec', '')} {spec.dtype.name}" for key, spec in specs.items()}


def _check_alike(names: Sequence[str], signatures: Sequence[Mapping[str, str]], prefix: str) -> None:
    first = signatures[0]
    for index, signature in enumerate(signatures[1:], 1):
        if dict(signature) != dict(first):
            differ = sorted(k for k in set(first) | set(signature) if first.get(k) != signature.get(k))
            theirs = ", ".join(f"{k}: {signature.get(k, 'none')}" for k in differ)
            ours = ", ".join(f"{k}: {first.get(k, 'none')}" for k in differ)
            raise ConfigError(
                f"{prefix}.mixture.sources[{index}] ({names[index]}): after its own features and preprocess its "
                f"examples have {theirs}, where {names[0]}'s have {ours}; every source must come out with the same "
                "features (rename, cast or drop them with the source's own preprocess ops)")


def source_parser(names: Sequence[str], specs: Sequence[Mapping[str, Any]],
                  ops: Sequence[Sequence[Callable[..., Features]]], batched: bool,
                  prefix: str = "data") -> Callable[[Features], Features]:
    """fn(mixed element) → features: each record parsed with its source's spec and run through its source's
    ops (`ops[i]`: functions of (features, seed), deterministic), with `SOURCE_KEY` added."""
    parsers = [make_parser(dict(spec), batched=batched) for spec in specs]

    def one_source(index: int, records: tf.Tensor) -> Features:
        features = parsers[index](records)
        for op in ops[index]:
            features = op(features, None)
        return dict(features)

    # Each source's outputs, traced apart (nothing runs), so a misfit is named now, not inside tf.data.
    record_spec = tf.TensorSpec([None] if batched else [], tf.string)
    _check_alike(names, [_signature(tf.function(lambda r, i=index: one_source(i, r), autograph=False).get_concrete_function(
        record_spec).structured_outputs) for index in range(len(names))], prefix)

    def parse_batch(element: Features) -> Features:
        records, source = element[RECORDS_KEY], element[SOURCE_KEY]
        places, groups = [], []
        for index in range(len(names)):
            place = tf.where(tf.equal(source, index))[:, 0]
            places.append(place)
            groups.append(one_source(index, tf.gather(records, place)))
        inverse = tf.math.invert_permutation(tf.concat(places, 0))  # the records' order, from the groups'
        out = {key: tf.gather(tf.concat([group[key] for group in groups], 0), inverse) for key in groups[0]}
        out[SOURCE_KEY] = source
        return out

    def parse_one(element: Features) -> Features:
        record, source = element[RECORDS_KEY], element[SOURCE_KEY]
        out = tf.switch_case(source, [lambda i=index: one_source(i, record) for index in range(len(names))])
        out = dict(out)
        out[SOURCE_KEY] = source
        return out

    return parse_batch if batched else parse_one
