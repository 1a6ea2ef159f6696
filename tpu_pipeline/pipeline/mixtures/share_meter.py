"""A mixture's shares as delivered: examples and real tokens per source of its batches, beside the weights.

Each mixed example carries its source (`SOURCE_KEY`, its index in data.mixture.sources) up to the
outputs: one per example, or in pack mode each row the tokens and segments it holds of each source
(`_source_tokens`, `_source_segments`, [n] a row). `SourceMeter` adds the
counts up in host variables as batches pass (put before the outputs, as `with_source_meter` does);
`train`, `demo`, `bench` and `doctor` print `shares_line` from it.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import tensorflow as tf

from tpu_pipeline.config.mixture import MixtureConfig
from tpu_pipeline.pipeline.core.element_keys import EXAMPLE_MASK, SOURCE_KEY
from tpu_pipeline.pipeline.sequences.token_count import batch_leaves, real_token_mask, sequence_keys
from tpu_pipeline.pipeline.stages.base import Stage, StageContext


def source_counts(batch: Any, num_sources: int, source_key: str = SOURCE_KEY) -> tuple[tf.Tensor, tf.Tensor]:
    """(examples [n], real tokens [n]) per source of a batch of a mixture, int64. Pack mode: each row's
    `<source_key>_segments` and `<source_key>_tokens` ([b, n]: its segments and tokens of the first key
    from each source) added up, so examples are segments. Else `source_key` is each example's source
    ([b]): examples are rows (bucket: rows with `example_mask` 1), tokens those of the first token key
    (0 without data.sequence)."""
    leaves = dict(batch_leaves(batch))
    if f"{source_key}_tokens" in leaves:  # pack: counted per row by the packer
        return tuple(tf.reduce_sum(tf.cast(tf.convert_to_tensor(leaves[f"{source_key}_{what}"]), tf.int64), axis=0)
                     for what in ("segments", "tokens"))
    source = tf.cast(tf.convert_to_tensor(leaves[source_key]), tf.int32)
    keys = sequence_keys(batch)

    def per_source(ids: tf.Tensor, weights: Optional[tf.Tensor] = None) -> tf.Tensor:
        return tf.math.bincount(ids, weights=weights, minlength=num_sources, maxlength=num_sources, dtype=tf.int64)

    kept = tf.ones_like(source, tf.int64)
    if EXAMPLE_MASK in leaves:
        kept = tf.cast(tf.convert_to_tensor(leaves[EXAMPLE_MASK]) > 0, tf.int64)
    examples = per_source(source, kept)
    if not keys:
        return examples, tf.zeros([num_sources], tf.int64)
    marker = tf.convert_to_tensor(leaves[keys[0].marker])
    lengths = tf.reduce_sum(tf.cast(real_token_mask(marker, keys[0].packed), tf.int64), axis=1) * kept
    return examples, per_source(source, lengths)


class SourceMeter(Stage):
    """A stage that adds up examples and real tokens per source of a mixture's batches, in host variables
    (as `TokenMeter` does for all tokens): put before `ToOutputs`, where each example's (or token's)
    source still is, it gives `train` the rates each source was actually delivered at."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        with tf.device("/CPU:0"), tf.init_scope():
            self.examples = tf.Variable(tf.zeros([len(self.names)], tf.int64), trainable=False, name="source_examples")
            self.tokens = tf.Variable(tf.zeros([len(self.names)], tf.int64), trainable=False, name="source_tokens")

    def totals(self) -> tuple[list[int], list[int]]:
        return [int(v) for v in self.examples.numpy()], [int(v) for v in self.tokens.numpy()]

    def apply(self, dataset: tf.data.Dataset, context: Optional[StageContext] = None) -> tf.data.Dataset:
        def count(*element: Any) -> Any:  # a batch, or (batch, position) where no outputs stage follows
            examples, tokens = source_counts(element[0], len(self.names))
            with tf.control_dependencies([self.examples.assign_add(examples), self.tokens.assign_add(tokens)]):
                passed = tf.nest.map_structure(tf.identity, element)
            return passed if len(passed) > 1 else passed[0]

        return dataset.map(count, name="source_meter")



def with_source_meter(pipeline: Any) -> tuple[Any, Optional[SourceMeter]]:
    """A mixture's pipeline with a SourceMeter counted before the outputs pick the model's keys (each
    example's source goes no further); a single source, or one through data.service: unchanged."""
    if not pipeline.source.names or pipeline.service is not None:
        return pipeline, None
    meter = SourceMeter(pipeline.source.names)
    return pipeline.with_stage(meter, before="outputs"), meter


def configured_shares(mixture: MixtureConfig) -> list[float]:
    """The config's weights as shares of their sum."""
    total = sum(entry.weight for entry in mixture.sources)
    return [entry.weight / total for entry in mixture.sources]


def shares(counts: Sequence[int]) -> list[Optional[float]]:
    total = sum(counts)
    return [count / total if total else None for count in counts]


def shares_line(mixture: MixtureConfig, examples: Sequence[int], tokens: Sequence[int]) -> str:
    """The delivered shares of what the weights are shares of (tokens or examples), each beside its
    weight, in one phrase: 'tokens by source: docs 0.702 (0.7), code 0.298 (0.3)'."""
    by_tokens = mixture.weight_by == "tokens" and sum(tokens) > 0
    delivered = shares(tokens if by_tokens else examples)
    parts = [f"{entry.name} {'-' if share is None else f'{share:.3f}'} ({weight:.3g})"
             for entry, share, weight in zip(mixture.sources, delivered, configured_shares(mixture))]
    return f"{'tokens' if by_tokens else 'examples'} by source: " + ", ".join(parts)


def mixture_counts(mixture: MixtureConfig, examples: Sequence[int], tokens: Sequence[int]) -> dict[str, dict[str, Any]]:
    """Per source: its weight (a share), the examples and real tokens counted and their shares (pack mode:
    examples are segments, a document longer than a row counting once per piece), for JSON."""
    example_shares, token_shares = shares(examples), shares(tokens)
    return {entry.name: {"weight": weight, "examples": int(examples[index]), "tokens": int(tokens[index]),
                         "example_share": example_shares[index], "token_share": token_shares[index]}
            for index, (entry, weight) in enumerate(zip(mixture.sources, configured_shares(mixture)))}
