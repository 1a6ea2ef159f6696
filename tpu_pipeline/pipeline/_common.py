"""Tiny helpers shared by the pipeline stages."""
from __future__ import annotations

import os
from typing import Union

import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE


LOCAL_READ_BUFFER = 256 * 1024
REMOTE_READ_BUFFER = 8 * 1024 * 1024


def available_cores() -> int:
    """Cores this process may run on (affinity-aware, so containers and taskset are respected)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


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
