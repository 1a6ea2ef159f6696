"""A mixture whose sources differ: each source's records parsed with its own spec and run through its own
ops, then stitched back in the mixed order, so the stages after see one shape.

Every mixed record ends with its source's tag (`mixture_source.source_tag`), so which source a
record came from is read off its last bytes, before any parse. Then:

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
from tpu_pipeline.pipeline.mixture_source import SOURCE_KEY, source_tag
from tpu_pipeline.pipeline.parse import make_parser

Features = dict[str, Any]


def source_of_records(records: tf.Tensor, count: int) -> tf.Tensor:
    """Each record's source index (int32, the shape of `records`), from the tag at its end."""
    tags = [source_tag(index) for index in range(count)]
    if len({len(tag) for tag in tags}) == 1:  # < 128 sources: every tag the same length, compare the suffix
        suffix = tf.strings.substr(records, -len(tags[0]), len(tags[0]))
        matches = tf.equal(tf.expand_dims(suffix, -1), tf.constant(tags))
        return tf.cast(tf.argmax(tf.cast(matches, tf.int32), axis=-1), tf.int32)
    parse = tf.io.parse_example if records.shape.rank == 1 else tf.io.parse_single_example
    return tf.cast(parse(records, {SOURCE_KEY: tf.io.FixedLenFeature([], tf.int64)})[SOURCE_KEY], tf.int32)


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
                  prefix: str = "data") -> Callable[[tf.Tensor], Features]:
    """fn(records) → features: each record parsed with its source's spec and run through its source's ops
    (`ops[i]`: functions of (features, seed), deterministic), with `SOURCE_KEY` added."""
    parsers = [make_parser({k: v for k, v in spec.items() if k != SOURCE_KEY}, batched=batched) for spec in specs]

    def one_source(index: int, records: tf.Tensor) -> Features:
        features = parsers[index](records)
        for op in ops[index]:
            features = op(features, None)
        return dict(features)

    # Each source's outputs, traced apart (nothing runs), so a misfit is named now, not inside tf.data.
    record_spec = tf.TensorSpec([None] if batched else [], tf.string)
    _check_alike(names, [_signature(tf.function(lambda r, i=index: one_source(i, r)).get_concrete_function(
        record_spec).structured_outputs) for index in range(len(names))], prefix)

    def parse_batch(records: tf.Tensor) -> Features:
        source = source_of_records(records, len(names))
        places, groups = [], []
        for index in range(len(names)):
            place = tf.where(tf.equal(source, index))[:, 0]
            places.append(place)
            groups.append(one_source(index, tf.gather(records, place)))
        inverse = tf.math.invert_permutation(tf.concat(places, 0))  # the records' order, from the groups'
        out = {key: tf.gather(tf.concat([group[key] for group in groups], 0), inverse) for key in groups[0]}
        out[SOURCE_KEY] = source
        return out

    def parse_one(record: tf.Tensor) -> Features:
        source = source_of_records(record, len(names))
        out = tf.switch_case(source, [lambda i=index: one_source(i, record) for index in range(len(names))])
        out = dict(out)
        out[SOURCE_KEY] = source
        return out

    return parse_batch if batched else parse_one
