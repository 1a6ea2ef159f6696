"""Small helpers shared by the built-in ops."""
from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from tpu_pipeline.errors import ConfigError


def one_line(message: str) -> ConfigError:
    """A ConfigError to raise while a map is traced (an op's missing feature, a feature it cannot take), kept
    one line: AutoGraph would otherwise re-raise it with its "in user code:" trace in the message.
    `ag_pass_through` is AutoGraph's (private) mark for an error to let through as it is; were it to go,
    the message would only gain those lines again."""
    error = ConfigError(message)
    error.ag_pass_through = True
    return error


def feature(features: dict[str, Any], key: str, op: str) -> Any:
    """Returns features[key]; a missing key names the op and the keys that do exist (one line, also
    when raised inside a traced map)."""
    if key not in features:
        raise one_line(
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
