"""The input-wait meter tells a starved consumer from a fed one."""
from __future__ import annotations

import time

import pytest
import tensorflow as tf

from tpu_pipeline.pipeline.runtime.wait_meter import InputWaitMeter, metered

pytestmark = pytest.mark.tf_builds


def _share_waiting(dataset: tf.data.Dataset, consumer_seconds: float, elements: int) -> float:
    meter = InputWaitMeter()
    iterator = iter(metered(dataset, meter))
    next(iterator)
    meter.reset()
    start = time.perf_counter()
    for _ in range(elements):
        next(iterator)
        time.sleep(consumer_seconds)  # the "training step"
    return meter.totals()[0] / (time.perf_counter() - start)


def _slow(value):
    # 20 ms an element against the consumer's 1 ms: on a loaded machine the consumer's short sleep
    # overruns by milliseconds (4 busy processes on 2 cores: share 0.69 with 10 ms, 0.88-0.92 with 20).
    time.sleep(0.02)
    return value


def test_starved_consumer_waits_most_of_the_time():
    slow = tf.data.Dataset.range(1000).map(lambda x: tf.py_function(_slow, [x], tf.int64))
    assert _share_waiting(slow, consumer_seconds=0.001, elements=30) > 0.5


def test_fed_consumer_hardly_waits():
    fast = tf.data.Dataset.range(1000).prefetch(100)
    assert _share_waiting(fast, consumer_seconds=0.01, elements=30) < 0.2


def test_meter_counts_every_element():
    meter = InputWaitMeter()
    assert [int(x) for x in metered(tf.data.Dataset.range(5), meter)] == [0, 1, 2, 3, 4]
    assert meter.totals()[1] == 5


def test_meter_counts_requests_and_deliveries_which_reset_leaves():
    # What train's stall watch reads: a request not yet answered is one more asked for than delivered.
    meter = InputWaitMeter()
    iterator = iter(metered(tf.data.Dataset.range(5), meter))
    for _ in range(3):
        next(iterator)
    meter.reset()
    assert meter.requests() == (3, 3) and meter.totals()[1] == 0
    assert [int(x) for x in iterator] == [3, 4]
    assert meter.requests() == (6, 5)  # the last request found the end of the data
