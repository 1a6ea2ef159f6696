"""tf.data tuning from the config: parallelism (`tune`: autotune, auto = the cores, or a number) and read buffers."""
from __future__ import annotations

from typing import Union

import tensorflow as tf

from tpu_pipeline.system import available_cores

AUTOTUNE = tf.data.AUTOTUNE


LOCAL_READ_BUFFER = 256 * 1024
REMOTE_READ_BUFFER = 8 * 1024 * 1024


def tune(value: Union[int, str]) -> int:
    """Config value ('autotune', 'auto' = available cores, or an int) → what tf.data takes."""
    if value == "autotune":
        return AUTOTUNE
    if value == "auto":
        return available_cores()
    return int(value)


def read_buffer(value: Union[int, str], path: str) -> int:
    """'auto' → a large buffer for remote files (latency-bound), TF's own size for local ones."""
    if value != "auto":
        return int(value)
    return REMOTE_READ_BUFFER if "://" in path else LOCAL_READ_BUFFER
