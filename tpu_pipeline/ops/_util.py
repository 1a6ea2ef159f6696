"""Small helpers shared by the built-in ops."""
from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from tpu_pipeline.errors import ConfigError


def feature(features: dict[str, Any], key: str, op: str) -> Any:
    """Returns features[key]; a missing key names the op and the keys that do exist."""
    if key not in features:
        raise ConfigError(
            f"op '{op}': feature '{key}' does not exist at this point of the pipeline; "
            f"features here: {', '.join(sorted(features))}. Set the op's 'key' argument."
        )
    return features[key]


def size_pair(size: int | Sequence[int], op: str) -> list[int]:
    """Accepts 224 or [224, 224]; anything else is a ConfigError."""
    if isinstance(size, int) and not isinstance(size, bool):
        pair = [size, size]
    elif isinstance(size, (list, tuple)) and len(size) == 2 and all(isinstance(s, int) for s in size):
        pair = list(size)
    else:
        raise ConfigError(f"op '{op}': size must be an int or [height, width], got {size!r}")
    if min(pair) <= 0:
        raise ConfigError(f"op '{op}': size must be positive, got {size!r}")
    return pair


def dtype(name: str, op: str) -> tf.DType:
    """Turns 'float32', 'bfloat16', 'int32', ... into a tf.DType, or a ConfigError."""
    try:
        return tf.as_dtype(name)
    except TypeError:
        raise ConfigError(
            f"op '{op}': unknown dtype {name!r}; use e.g. float32, bfloat16, float16, int32, uint8"
        ) from None
