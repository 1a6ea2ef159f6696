"""Where a windowed pipeline's stream stands after each element a consumer took: for `model.fit`.

A bucket or pack pipeline (data.sequence) cannot compute its position from a step count, since how
many examples a batch holds depends on the data; its elements carry `_window` and `_index` instead
(`Pipeline.build(with_position=True)`). The package's iterators read them as they hand elements
out. `model.fit` takes a dataset, not an iterator, so `PositionLog.attach` puts a sequential map at
the very end of the pipeline that strips the position and writes it into a host-side ring buffer,
indexed by how many elements the consumer has asked for. A consumer asks in order, at most a
prefetch buffer ahead of the step it computes, so the position after the element a finished step
consumed last is in the buffer (`after(elements)`): three integers, saved with the checkpoint.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.core.resume_position import last_position

CAPACITY = 4096  # elements a consumer may run ahead of the step it saves (prefetch buffers are far smaller)


class PositionLog:
    """(example, chunk, index) of every element taken from one input pipeline's dataset, in host variables."""

    def __init__(self) -> None:
        with tf.device("/CPU:0"), tf.init_scope():
            self.taken = tf.Variable(0, dtype=tf.int64, trainable=False, name="position_log_taken")
            self.log = tf.Variable(tf.zeros([CAPACITY, 3], tf.int64), trainable=False, name="position_log")

    def reset(self) -> None:
        """For a fresh dataset: element numbers count from 0 again."""
        self.taken.assign(0)

    def attach(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """`dataset` of (element, position) → the elements, each one's position logged as it is taken."""
        def record(element: Any, position: Any) -> Any:
            last = last_position(position)
            number = self.taken.assign_add(1) - 1
            update = self.log.scatter_nd_update([[number % CAPACITY]], [last])
            with tf.control_dependencies([update]):
                return tf.nest.map_structure(tf.identity, element)

        logged = dataset.map(record, name="position_log")
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False  # the map must run when the consumer asks
        return logged.with_options(options)

    def after(self, elements: int) -> tuple[int, int, int]:
        """(example, chunk where the window starts, outputs of it delivered) once the consumer has used
        `elements` elements."""
        if elements <= 0:
            raise ValueError("after(0): the position before any element is the one the dataset was built from")
        taken = int(self.taken.numpy())
        if not elements <= taken < elements + CAPACITY:
            raise ConfigError(f"the input position of element {elements} is no longer known ({taken} taken, "
                              f"{CAPACITY} remembered): a consumer ran further ahead than any prefetch buffer should")
        example, chunk, index = self.log[(elements - 1) % CAPACITY].numpy().tolist()
        return int(example), int(chunk), int(index) + 1
