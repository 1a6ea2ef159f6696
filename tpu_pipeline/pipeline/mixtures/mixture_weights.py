"""`weight_by: tokens`: the example rates that deliver each source's share of tokens.

The schedule chooses examples, so a token weight w_i becomes the example rate w_i / t_i, where t_i
is source i's mean tokens per example as the model receives them: the longest variable-length
feature of each of its first `SAMPLE_RECORDS` records (first files, in order: the same figure on
every host and every run), capped at the sequence length where the mode truncates (pad, bucket)
and not where it splits (pack). The delivered shares follow the weights as far as those first
records stand for the rest; `tpu-pipeline demo` and `train` show the shares delivered.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import numpy as np
import tensorflow as tf

from tpu_pipeline.config.data import SEQUENCE_KINDS
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.mixtures.mixture_source import MixtureSource
from tpu_pipeline.pipeline.stages.parse import make_parser

SAMPLE_RECORDS = 512  # records read from each source's first files to measure its tokens per example


def mean_tokens(source: Any, features: Mapping[str, Any], cap: Optional[int] = None) -> float:
    """Mean tokens per example over a source's first SAMPLE_RECORDS records (the longest sequence feature)."""
    keys = [key for key, spec in features.items() if spec.kind in SEQUENCE_KINDS]
    if not keys:
        raise ConfigError("data.mixture.weight_by=tokens: no feature of kind ragged or sequence to count tokens of; "
                          "use weight_by: examples")
    parse = make_parser({key: features[key] for key in keys}, batched=True)
    with tf.init_scope():
        records = tf.data.TFRecordDataset(source.tfrecord_files(), compression_type=source.compression)
        block = next(iter(records.batch(SAMPLE_RECORDS).take(1)), None)
        if block is None:
            raise ConfigError(f"data.mixture.weight_by=tokens: {source.tfrecord_files()[:1]} hold no record to measure")
        parsed = parse(block)
        lengths = np.max([_row_lengths(parsed[key]) for key in keys], axis=0)
    counts = np.asarray(lengths, np.float64)
    if cap:
        counts = np.minimum(counts, cap)
    return max(float(counts.mean()), 1.0)


def by_tokens(source: MixtureSource, features: Mapping[str, Any], sequence: Any) -> MixtureSource:
    """`source` whose example rates deliver its configured weights as shares of tokens."""
    cap = max(sequence.lengths.values()) if sequence is not None and sequence.overflow == "truncate" else None
    means = [mean_tokens(part.source, features, cap) for part in source.parts]
    rates = [part.weight / mean for part, mean in zip(source.parts, means)]
    return dataclasses.replace(source, weights=tuple(rate / sum(rates) for rate in rates), tokens_per_example=tuple(means))


def _row_lengths(values: Any) -> np.ndarray:
    """Tokens of each example of a parsed batch (ragged, or padded dense with -1 / 0 as parse pads)."""
    if isinstance(values, tf.RaggedTensor):
        return values.row_lengths().numpy()
    return np.full([int(values.shape[0])], int(values.shape[1]) if values.shape.rank > 1 else 1)
