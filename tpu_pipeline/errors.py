"""Exceptions a user can cause. Each message names the key, file, record or flag at fault and the fix.

A user's mistake must never surface as a bare TensorFlow stack trace: code that validates user input
raises one of these instead, so scripts and notebooks can catch `TpuPipelineError` alone.
"""
from __future__ import annotations


class TpuPipelineError(Exception):
    """Base class for every error this package raises on purpose."""


class ConfigError(TpuPipelineError):
    """A config key is unknown, has the wrong type, or holds an impossible value.

    Deliberately not a ValueError: pydantic would swallow it into its own error list and
    lose the precise message a validator wrote.
    """


class DataError(TpuPipelineError):
    """Input data is missing, unreadable or does not match its declared spec."""


class TpuCompatibilityError(TpuPipelineError):
    """A dataset's element spec cannot be fed to a TPU (dynamic shape or unsupported dtype)."""


class ClusterError(TpuPipelineError):
    """The requested accelerator could not be found or initialized."""


class PeerFailure(ClusterError):
    """A peer worker of a multi-worker run stopped or cannot be reached: this worker stops too.

    The CLI ends the process at once after saying so (os._exit): with a dead peer, TensorFlow's
    teardown of the collectives and the coordination service can wait minutes for it at exit."""
