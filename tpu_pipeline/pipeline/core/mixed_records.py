"""What a mixture's source yields: serialized records with each record's source beside them.

A mixed element is the dict `{RECORDS_KEY: records, SOURCE_KEY: sources}` (two vectors, or two
scalars when the plan reads single records): the records as their files hold them, and each one's
index in data.mixture.sources (int32, as a TPU takes it). The source travels beside the records,
not inside them: the batched parse reads only the records, and `with_sources` adds `SOURCE_KEY` to
what it returns, so counting and evaluating by source cost neither a copy of each record (an appended
tag did) nor a feature to parse. Stages that move records whole (`Batch(records=True)`) read the
records' spec with `records_spec`.
"""
from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from tpu_pipeline.pipeline.core.element_keys import RECORDS_KEY, SOURCE_KEY

Features = dict[str, Any]


def is_mixed(spec: Any) -> bool:
    """Whether an element (or its spec) is a mixture's records with their sources."""
    return isinstance(spec, dict) and RECORDS_KEY in spec


def records_spec(spec: Any) -> Any:
    """The spec of an element's serialized records: the element's own, or a mixed element's records'."""
    return spec[RECORDS_KEY] if is_mixed(spec) else spec


def mixed(records: tf.Tensor, sources: tf.Tensor) -> Features:
    """A mixed element: `records` and each one's source index."""
    return {RECORDS_KEY: records, SOURCE_KEY: tf.cast(sources, tf.int32)}


def with_sources(parse: Callable[[tf.Tensor], Features]) -> Callable[[Features], Features]:
    """A parse of records as a parse of mixed elements: the records parsed, their sources added as `SOURCE_KEY`."""

    def parse_mixed(element: Features) -> Features:
        features = dict(parse(element[RECORDS_KEY]))
        features[SOURCE_KEY] = element[SOURCE_KEY]
        return features

    return parse_mixed
