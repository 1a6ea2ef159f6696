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


class JaxCoordinationStore:
    """The key-value store of `jax.distributed`'s coordination service (process 0 hosts it): the same
    small agreements on the JAX path. Its client is not public API either; this is its one seam."""

    def __init__(self) -> None:
        from jax._src import distributed  # the only private JAX import of the package

        self._client = distributed.global_state.client
        if self._client is None:
            raise RuntimeError("jax.distributed is not started: its coordination service runs only with several processes")

    def set(self, key: str, value: str) -> bool:
        try:
            self._client.key_value_set(key, value)
        except Exception as error:  # jaxlib's runtime error carries the gRPC status in its text
            text = str(error)
            if "ALREADY_EXISTS" in text or "already exists" in text.lower():
                return False
            raise StoreUnavailable(text.splitlines()[0]) from None
        return True

    def get(self, key: str, timeout_seconds: Optional[float] = None) -> Optional[str]:
        timeout_ms = 2**31 - 1 if timeout_seconds is None else max(1, int(timeout_seconds * 1000))
        try:
            return self._client.blocking_key_value_get(key, timeout_ms)
        except Exception as error:
            text = str(error)
            if "DEADLINE_EXCEEDED" in text or "timed out" in text.lower():
                return None
            raise StoreUnavailable(text.splitlines()[0]) from None

    def put(self, key: str, value: str) -> None:
        """Sets `key`, over a value it had (a process's beat: `train/peer_watch.py`)."""
        try:
            self._client.key_value_set(key, value, allow_overwrite=True)
        except Exception as error:
            raise StoreUnavailable(str(error).splitlines()[0]) from None

    def peek(self, key: str) -> Optional[str]:
        """The value of `key` now, None when it is not set: no wait."""
        try:
            return self._client.key_value_try_get(key)
        except Exception as error:
            text = str(error)
            if "NOT_FOUND" in text or "not found" in text.lower():
                return None
            raise StoreUnavailable(text.splitlines()[0]) from None


def store_for(framework: str) -> KeyValueStore:
    """The store of this process's cluster: TensorFlow's coordination service, or JAX's."""
    return JaxCoordinationStore() if framework == "jax" else CoordinationService()
