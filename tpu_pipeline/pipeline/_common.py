"""Tiny helpers shared by the pipeline stages."""
from __future__ import annotations

from typing import Union

import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE


def tune(value: Union[int, str]) -> int:
    """Config value ('autotune' or an int) → what tf.data takes."""
    return AUTOTUNE if value == "autotune" else int(value)
