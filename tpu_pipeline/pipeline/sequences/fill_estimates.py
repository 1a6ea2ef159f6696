"""What another sequence mode or window would fill: the doctor's what-if estimates on the lengths seen.

    pad_fraction(lengths, 512)                    # real tokens / slots if each example were padded to 512
    pack_fraction(lengths, 512, window=1024)      # ... if packed, by the pipeline's own packer
    bucket_fraction(lengths, [128, 256, 512], batch=32, window=1024)

`tpu-pipeline doctor` (`bench.sequence_advice`) and each mode's `fraction` call these on the example
lengths a pipeline delivered (`token_count.example_lengths`); the counts of what a pipeline does
deliver are `token_count`'s.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
import tensorflow as tf

from tpu_pipeline.pipeline.sequences.packing import Packer


def pad_fraction(lengths: Iterable[int], length: int) -> float:
    """Pad mode: each example padded (or cut) to `length`."""
    values = np.minimum(np.asarray(list(lengths), np.int64), length)
    return float(values.sum() / (len(values) * length)) if len(values) else 0.0


def pack_fraction(lengths: Iterable[int], length: int, window: int, algorithm: str = "first_fit_decreasing",
                  overflow: str = "truncate") -> float:
    """Pack mode: the examples, in this order, packed in windows of `window` by the pipeline's own
    packer (`packing.Packer`, in a dataset: one trace for every window); real tokens / (rows × length)."""
    values = np.asarray(list(lengths), np.int32)
    if not len(values):
        return 0.0
    examples = tf.data.Dataset.from_tensor_slices(values).map(lambda n: {"tokens": tf.zeros([n], tf.int32)})
    rows = Packer({"tokens": length}, window, algorithm, overflow, num_parallel_calls=1).apply(examples)
    counts = rows.batch(4096).map(lambda batch: tf.stack([
        tf.math.count_nonzero(batch["tokens_segment_ids"], dtype=tf.int64), tf.shape(batch["tokens"], tf.int64)[0]]))
    real, num_rows = (int(v) for v in counts.reduce(tf.zeros([2], tf.int64), lambda total, more: total + more))
    return real / (num_rows * length) if num_rows else 0.0


def bucket_fraction(lengths: Iterable[int], bucket_lengths: Sequence[int], batch: int, window: int) -> float:
    """Bucket mode, one replica: per window, each example padded to its bucket's length, each bucket's
    last batch filled with padding examples (`batch`: per bucket batch, a list or one number)."""
    values = np.minimum(np.asarray(list(lengths), np.int64), bucket_lengths[-1])
    sizes = list(batch) if isinstance(batch, (list, tuple)) else [batch] * len(bucket_lengths)
    slots = 0
    for start in range(0, len(values), window):
        bucket = np.minimum(np.searchsorted(np.asarray(bucket_lengths), values[start:start + window], side="left"),
                            len(bucket_lengths) - 1)
        for index, (size, bound) in enumerate(zip(sizes, bucket_lengths)):
            slots += math.ceil(int((bucket == index).sum()) / size) * size * bound
    return float(values.sum() / slots) if slots else 0.0
