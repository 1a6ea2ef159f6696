"""Where epochs begin: `Repeat`, and `Repeat.epochs`, which builds the epochs one by one so the stages
before it know their epoch, and starts a resumed stream at its epoch.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar, Optional

import tensorflow as tf

from tpu_pipeline.pipeline.stages.base import Stage, StageContext


@dataclasses.dataclass(frozen=True)
class Repeat(Stage):
    """Repeats `count` times; None repeats forever."""

    roles: ClassVar[tuple[str, ...]] = ("repeat",)
    count: Optional[int] = None

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        if self.count == 1:
            return dataset
        return dataset.repeat(self.count)

    def epochs(self, one_epoch: Callable[[tf.Tensor], tf.data.Dataset], differ: bool = True,
               first: int = 0, head: Optional[Callable[[tf.data.Dataset], tf.data.Dataset]] = None) -> tf.data.Dataset:
        """`one_epoch(e)` for e = 0, 1, ... in sequence: how a Pipeline repeats, so that everything
        before the repeat knows its epoch (file order, shuffle seeds). When the epochs do not
        `differ`, epoch 0 is simply repeated: a `flat_map` over epochs costs ~0.13 µs an element,
        and keeps tf.data from fusing a shuffle with the repeat (~0.2 µs more), which matters only
        for single small records (benchmarks/bench_epochs.py).

        A resumed stream starts at epoch `first`, whose dataset goes through `head` (the skip of
        what was delivered before)."""
        end = None if self.count is None else self.count
        if head is not None or first:
            if end is not None and first >= end:
                # Resumed after the last example (a checkpoint at the end of the data): nothing is left.
                return one_epoch(tf.constant(end - 1, tf.int64)).take(0)
            head = head or (lambda dataset: dataset)
            if differ and self.count != 1:
                # Built inside a function, as the uninterrupted stream builds this epoch: the
                # same seeds (an eager build would pair a shuffle's seed with TF's global seed).
                start = tf.data.Dataset.range(first, first + 1).flat_map(lambda epoch: head(one_epoch(epoch)))
            else:
                start = head(one_epoch(tf.constant(first, tf.int64)))
            if end == first + 1:
                return start
            if not differ:
                return start.concatenate(one_epoch(tf.constant(0, tf.int64)).repeat(None if end is None else end - first - 1))
            rest = tf.data.Dataset.range(first + 1, (1 << 62) if end is None else end)
            return start.concatenate(rest.flat_map(one_epoch))
        if self.count == 1:
            return one_epoch(tf.constant(0, tf.int64))
        if not differ:
            return one_epoch(tf.constant(0, tf.int64)).repeat(self.count)
        epochs = tf.data.Dataset.range(1 << 62 if self.count is None else self.count)
        return epochs.flat_map(one_epoch)
