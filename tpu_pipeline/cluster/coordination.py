"""A key-value store shared by the processes of a TF_CONFIG cluster: TensorFlow's coordination service.

MultiWorkerMirroredStrategy starts that service (the chief hosts it); TF's own
`PreemptionCheckpointHandler` agrees on its save step through it. We use it for the same kind of
small agreements (which checkpoint every worker restored, at which step all stop after a SIGTERM)
because it costs nothing per training step, unlike an all-reduce. Its Python entry points are not
public API, so this module is the one narrow seam to them: a test, or a later TF, replaces only this.
"""
from __future__ import annotations

from typing import Optional, Protocol

import tensorflow as tf


class StoreUnavailable(Exception):
    """The process that hosts the store is gone (it exited or was killed)."""


class KeyValueStore(Protocol):
    def set(self, key: str, value: str) -> bool:
        """Sets `key` once; False when another process set it first (the first value stays).
        Raises StoreUnavailable when the store's host is gone."""

    def get(self, key: str, timeout_seconds: Optional[float] = None) -> Optional[str]:
        """The value of `key`, waiting for it to be set; None after `timeout_seconds`.
        Raises StoreUnavailable when the store's host is gone."""


class CoordinationService:
    """The running coordination service of this process's TF cluster."""

    def __init__(self) -> None:
        from tensorflow.python.eager import context  # the only private TF import of the package

        self._context = context.context()
        if self._context.coordination_service is None:
            raise RuntimeError("TensorFlow's coordination service is not running: it starts with "
                               "MultiWorkerMirroredStrategy on a TF_CONFIG cluster")

    def set(self, key: str, value: str) -> bool:
        try:
            self._context.set_config_key_value(key, value)
        except tf.errors.AlreadyExistsError:
            return False
        except tf.errors.UnavailableError as error:
            raise StoreUnavailable(str(error).splitlines()[0]) from None
        return True

    def get(self, key: str, timeout_seconds: Optional[float] = None) -> Optional[str]:
        timeout_ms = 0 if timeout_seconds is None else max(1, int(timeout_seconds * 1000))
        try:
            return self._context.get_config_key_value(key, timeout_ms)
        except tf.errors.DeadlineExceededError:
            return None
        except tf.errors.UnavailableError as error:
            raise StoreUnavailable(str(error).splitlines()[0]) from None
