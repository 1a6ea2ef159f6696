"""tf.Example parsing from the config's feature spec."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import tensorflow as tf

from tpu_pipeline.format.example_check import feature_spec

def make_parser(features: Mapping[str, Any], batched: bool = False) -> Callable[[tf.Tensor], dict[str, tf.Tensor]]:
    """Returns fn(serialized) → dict of dense tensors (VarLen features densified).

    batched=True parses a whole vector of records with one `parse_example` call.
    """
    spec = feature_spec(features)
    defaults = {name: f.default for name, f in features.items()}
    parse_fn = tf.io.parse_example if batched else tf.io.parse_single_example

    def parse(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        parsed = parse_fn(serialized, spec)
        for name, value in parsed.items():
            if isinstance(value, tf.SparseTensor):
                default = defaults[name]
                parsed[name] = tf.sparse.to_dense(value, default_value=default) if default is not None else tf.sparse.to_dense(value)
        return parsed

    return parse
