"""Token counting at run time: real tokens, token slots and the non-padding fraction of a sequence batch.

    real, slots = real_and_slots(batch)      # int64 scalars
    non_padding_fraction(batch)              # float32 scalar: real / slots (0 when there are no slots)

A `data.sequence` pipeline marks padding beside each token key, never by value (token 0 is real):

- pack: `<key>_segment_ids`, 0 on padding → real = segment id > 0;
- pad, bucket: `<key>_mask`, 1 on real tokens → real = mask == 1 (in bucket mode the padding
  examples that fill a bucket's last batch have an all-0 mask, so they count as padding too).

Slots are all positions of the key ([b, length]: b × length), what the accelerator computes on.
A batch is what the pipeline yields: a feature dict, or Keras' `(inputs, targets[, weights])` with
each part a tensor or a dict (data.outputs with lists of keys): keys are found by these names
wherever they are (their marker, `<key>_mask` or `<key>_segment_ids`, must be in the batch).

Which key: by default the FIRST sequence key, in the order tf.nest walks the batch (a dict's keys
sorted, the tuple in order: `inputs` before `targets`). One key, because the keys of one example
are usually the same tokens (a language model's inputs and targets, shifted by one): summing them
would count each token twice in tokens/s, and would not change the fraction. `keys=` names one key
or several (their counts are summed), e.g. `keys=["inputs", "targets"]` for T5-style lengths.

TF ops only: works eagerly, in a `tf.function` and in a `dataset.map`. `example_lengths` also serves
`tpu-pipeline doctor`, whose what-if estimates for another mode or window are `fill_estimates`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Optional, Sequence, Union

import tensorflow as tf

from tpu_pipeline.pipeline.core.element_keys import EXAMPLE_MASK, MASK_SUFFIX, SEGMENT_SUFFIX
from tpu_pipeline.pipeline.stages.base import Stage, StageContext

Keys = Union[str, Sequence[str], None]


@dataclasses.dataclass(frozen=True)
class SequenceKey:
    """A token key of a batch and the feature that marks its real tokens."""

    name: str  # the token key, e.g. "tokens"
    marker: str  # "tokens_segment_ids" (pack) or "tokens_mask" (pad, bucket)

    @property
    def packed(self) -> bool:
        return self.marker.endswith(SEGMENT_SUFFIX)


def batch_leaves(element: Any, name: str = "") -> Iterator[tuple[str, Any]]:
    """(feature name, value) for every tensor or spec of a batch, in tf.nest's order."""
    if isinstance(element, dict):
        for key in sorted(element):
            yield from batch_leaves(element[key], str(key))
    elif isinstance(element, (tuple, list)):
        for item in element:
            yield from batch_leaves(item, "")
    elif name:
        yield name, element


def _rank(value: Any) -> Optional[int]:
    shape = getattr(value, "shape", None)
    return None if shape is None else len(shape)


def sequence_keys(batch_or_spec: Any) -> list[SequenceKey]:
    """The token keys of a batch (or of its `element_spec`), in tf.nest's order. A key is a
    rank-2 feature `k` with `k_segment_ids` (pack) or `k_mask` (pad, bucket) beside it; `k_mask`
    alone also counts (the marker has the key's shape), so a batch that kept only the mask works."""
    leaves = dict(batch_leaves(batch_or_spec))
    found: dict[str, SequenceKey] = {}
    for name, value in leaves.items():
        for suffix in (SEGMENT_SUFFIX, MASK_SUFFIX):
            if name.endswith(suffix) and name != EXAMPLE_MASK and _rank(value) == 2:
                key = name[: -len(suffix)]
                if key and (key not in found or suffix == SEGMENT_SUFFIX):
                    found[key] = SequenceKey(key, name)
    order = {name: index for index, name in enumerate(leaves)}
    return sorted(found.values(), key=lambda k: order.get(k.name, order[k.marker]))


def _chosen(batch: Any, keys: Keys) -> tuple[list[SequenceKey], dict[str, Any]]:
    leaves = dict(batch_leaves(batch))
    available = sequence_keys(batch)
    if not available:
        raise ValueError(
            f"no token key in this batch (features: {sorted(leaves)}): a data.sequence batch has <key>_segment_ids "
            "(pack) or <key>_mask (pad, bucket) beside each key; with data.outputs, pick keys as lists so they stay named")
    if keys is None:
        return available[:1], leaves
    wanted = [keys] if isinstance(keys, str) else list(keys)
    by_name = {k.name: k for k in available}
    missing = [k for k in wanted if k not in by_name]
    if missing:
        raise ValueError(f"keys {missing} have no <key>_segment_ids or <key>_mask in this batch; "
                         f"token keys here: {sorted(by_name)}")
    return [by_name[k] for k in wanted], leaves


def real_token_mask(marker: tf.Tensor, packed: bool) -> tf.Tensor:
    """Where a key's marker (its segment ids when `packed`, else its mask) says a token is real."""
    marker = tf.convert_to_tensor(marker)
    return marker > 0 if packed else tf.equal(marker, tf.ones([], marker.dtype))


def real_and_slots(batch: Any, keys: Keys = None) -> tuple[tf.Tensor, tf.Tensor]:
    """(real tokens, token slots) of a batch, int64 scalars, over the first token key (or `keys`)."""
    chosen, leaves = _chosen(batch, keys)
    real = tf.constant(0, tf.int64)
    slots = tf.constant(0, tf.int64)
    for key in chosen:
        marker = tf.convert_to_tensor(leaves[key.marker])
        real += tf.math.count_nonzero(real_token_mask(marker, key.packed), dtype=tf.int64)
        slots += tf.size(marker, out_type=tf.int64)
    return real, slots


def non_padding_fraction(batch: Any, keys: Keys = None) -> tf.Tensor:
    """Real tokens / token slots of a batch (float32 scalar; 0 for a batch with no slots)."""
    real, slots = real_and_slots(batch, keys)
    return tf.cast(tf.math.divide_no_nan(tf.cast(real, tf.float64), tf.cast(slots, tf.float64)), tf.float32)


def real_examples(batch: Any, keys: Keys = None) -> tf.Tensor:
    """Examples in a batch (int64 scalar): pack → segments (the largest segment id of each row,
    summed); bucket → rows with `example_mask` 1; pad → rows."""
    chosen, leaves = _chosen(batch, keys)
    marker = tf.convert_to_tensor(leaves[chosen[0].marker])
    if chosen[0].packed:
        return tf.reduce_sum(tf.cast(tf.reduce_max(marker, axis=1), tf.int64))
    if EXAMPLE_MASK in leaves:
        return tf.math.count_nonzero(leaves[EXAMPLE_MASK], dtype=tf.int64)
    return tf.shape(marker, out_type=tf.int64)[0]


def example_lengths(batch: Any, keys: Keys = None) -> tf.Tensor:
    """The real tokens of each example of a batch, 1-D int64 (the first token key, or `keys[0]`):
    pad → each row's mask; bucket → the same, for rows with `example_mask` 1; pack → each segment."""
    chosen, leaves = _chosen(batch, keys)
    key = chosen[0]
    marker = tf.convert_to_tensor(leaves[key.marker])
    if key.packed:
        ids = tf.cast(marker, tf.int32)
        width = tf.reduce_max(tf.concat([tf.reshape(ids, [-1]), [0]], 0)) + 1
        counts = tf.math.bincount(ids, minlength=width, maxlength=width, axis=-1, dtype=tf.int64)[:, 1:]
        return tf.boolean_mask(counts, counts > 0)  # segments are 1..n in a row, none empty
    lengths = tf.reduce_sum(tf.cast(real_token_mask(marker, False), tf.int64), axis=1)
    if EXAMPLE_MASK in leaves:
        lengths = tf.boolean_mask(lengths, tf.convert_to_tensor(leaves[EXAMPLE_MASK]) > 0)
    return lengths


class TokenMeter(Stage):
    """A stage that adds up real tokens and token slots of the batches going through it, in host
    variables (as `wait_meter` does for waits): put before `ToOutputs`, where the masks and segment
    ids still are, it gives `train` the non-padding fraction of what it trained on (the batches
    a prefetch buffer holds at the end are counted too: a few among thousands)."""

    def __init__(self) -> None:
        with tf.device("/CPU:0"), tf.init_scope():
            self.real = tf.Variable(0, dtype=tf.int64, trainable=False, name="real_tokens")
            self.slots = tf.Variable(0, dtype=tf.int64, trainable=False, name="token_slots")

    def fraction(self) -> Optional[float]:
        slots = int(self.slots.numpy())
        return int(self.real.numpy()) / slots if slots else None

    def apply(self, dataset: tf.data.Dataset, context: Optional[StageContext] = None) -> tf.data.Dataset:
        def count(batch: Any) -> Any:
            real, slots = real_and_slots(batch)
            with tf.control_dependencies([self.real.assign_add(real), self.slots.assign_add(slots)]):
                return tf.nest.map_structure(tf.identity, batch)

        return dataset.map(count, name="token_meter")

