"""Measures how long the consumer of a dataset waits for each element.

`metered(dataset, meter)` zips a timestamp stream in front of the dataset: tf.data's zip asks its
inputs for their next element in order, so each timestamp is taken just before the dataset is
asked for an element, and the map after the zip sees how long that request blocked. The waits
add up in a host-side variable that a training callback reads (no Keras here). When the pipeline
keeps up, its prefetch buffer is full and each wait is microseconds; when it does not, the wait
is the time the accelerator would stand idle.

The meter also counts requests and deliveries (never reset): a request the dataset has not answered
for long is a stalled input, which `train`'s stall watch (`train.stall`) ends the run on.
"""
from __future__ import annotations

import tensorflow as tf


class InputWaitMeter:
    """Total seconds spent waiting for elements, and their count, in host-side variables."""

    def __init__(self) -> None:
        with tf.device("/CPU:0"), tf.init_scope():
            self.wait_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="input_wait_seconds")
            self.elements = tf.Variable(0, dtype=tf.int64, trainable=False, name="input_wait_elements")
            # Monotonic (reset() leaves them): elements asked for, and delivered, since the meter was made.
            self.requested = tf.Variable(0, dtype=tf.int64, trainable=False, name="input_requested")
            self.delivered = tf.Variable(0, dtype=tf.int64, trainable=False, name="input_delivered")
        self.context: tf.distribute.InputContext | None = None  # of the last dataset metered (`metered`)

    def totals(self) -> tuple[float, int]:
        return float(self.wait_seconds.numpy()), int(self.elements.numpy())

    def requests(self) -> tuple[int, int]:
        """(elements asked for, elements delivered) since the meter was made: a request outstanding is
        one the dataset has not answered yet."""
        return int(self.requested.numpy()), int(self.delivered.numpy())

    def reset(self) -> None:
        self.wait_seconds.assign(0.0)
        self.elements.assign(0)


def metered(dataset: tf.data.Dataset, meter: InputWaitMeter,
            context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
    """The same elements, with each request's blocking time added to `meter`. `context`: the input
    pipeline the dataset is (kept on the meter, for a stalled stream's diagnosis)."""
    if context is not None:
        meter.context = context

    def asked(_):
        with tf.control_dependencies([meter.requested.assign_add(1)]):
            return tf.timestamp()

    clock = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat().map(asked)

    def record(requested_at, element):
        waited = tf.timestamp() - requested_at
        with tf.control_dependencies([meter.wait_seconds.assign_add(waited), meter.elements.assign_add(1),
                                      meter.delivered.assign_add(1)]):
            return tf.nest.map_structure(tf.identity, element)

    timed = tf.data.Dataset.zip((clock, dataset)).map(record, name="input_wait_meter")
    options = tf.data.Options()
    # A prefetch injected after the meter would move the measured wait onto its own thread.
    options.experimental_optimization.inject_prefetch = False
    return timed.with_options(options)
