"""`read_order.epoch_indices` against tf.data's own interleave, sequential and parallel (deterministic).

A mixture over the record cache takes each epoch's record order from this replay instead of reading
indices through the interleave; if the two ever differ, a resume from a run that read its files would
not continue exactly. Files of random lengths (empty ones too), more files than the cycle, blocks
that do not divide the runs, and block_length above 1.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.pipeline.sources.read_order import epoch_indices

pytestmark = pytest.mark.tf_builds


def interleaved(firsts, takes, record_block, cycle, block_length, parallel):
    """What Dataset.interleave yields over the runs, each read in blocks of `record_block` indices."""
    def one_file(first, take):
        blocks = (take + record_block - 1) // record_block
        return tf.data.Dataset.range(blocks).map(
            lambda k: tf.range(first + k * record_block, first + tf.minimum((k + 1) * record_block, take)))

    runs = tf.data.Dataset.from_tensor_slices((tf.constant(firsts, tf.int64), tf.constant(takes, tf.int64)))
    dataset = runs.interleave(one_file, cycle_length=cycle, block_length=block_length,
                              num_parallel_calls=tf.data.AUTOTUNE if parallel else None,
                              deterministic=True if parallel else None)
    return np.concatenate([np.zeros([0], np.int64), *dataset.as_numpy_iterator()])


@pytest.mark.parametrize("seed", range(12))
def test_the_replayed_order_is_the_interleaves(seed):
    rng = np.random.default_rng(seed)
    files = int(rng.integers(1, 12))
    takes = rng.integers(0, 90, files)
    takes[rng.integers(0, files)] = 0  # an empty run takes a turn too
    firsts = np.cumsum(rng.integers(0, 40, files) + 100) - 100
    record_block = int(rng.integers(1, 20))
    cycle = int(rng.integers(1, files + 2))
    block_length = int(rng.integers(1, 4))
    expected = interleaved(firsts, takes, record_block, cycle, block_length, parallel=False)
    assert len(expected) == takes.sum()
    got = epoch_indices(firsts, takes, record_block, cycle, block_length)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got, interleaved(firsts, takes, record_block, cycle, block_length, parallel=True))
