"""Facts about this machine and its paths, shared by every layer (it imports nothing of ours)."""
from __future__ import annotations

import contextlib
import gc
import os
import sys
from typing import Any, Iterator

# CPython runs its cyclic garbage collector every 700 net allocations. Importing TensorFlow and tracing a model
# and its input pipeline allocate millions of objects that live as long as the process, so a short `train` ran
# ~1,000 collections, a sixth of its CPU (issue 46: 1.6 of 10.4 s on the demo, 8 steps). Reference counting
# frees everything else at once either way; only garbage in reference cycles waits a little longer.
COLLECTION_THRESHOLDS = (20_000, 20, 20)


def fewer_collections() -> None:
    """Sets the thresholds our commands run with (`COLLECTION_THRESHOLDS`): for a process that builds large
    TensorFlow graphs. Process-wide, so only entry points call it (the CLI; a script may too)."""
    gc.set_threshold(*COLLECTION_THRESHOLDS)


def local_path(path: str, absolute: bool = False) -> str:
    """Expands `~` and `$VARS` in a local path; URLs (gs://, s3://, ...) are returned unchanged."""
    if "://" in path:
        return path
    expanded = os.path.expandvars(os.path.expanduser(path))
    return os.path.abspath(expanded) if absolute else expanded


def _is_url(path: str) -> bool:
    return "://" in path


def _local(path: str) -> str:
    """`path` cleaned lexically, as tf.io.gfile's local filesystem does (CleanPath): `a/../b` is `b`
    and `f.yaml/` is `f.yaml`, so plain Python finds the same file tf.io.gfile found."""
    return os.path.normpath(path) if path else path


def _gfile() -> Any:
    import tensorflow as tf  # noqa: PLC0415 (only URLs need it: reading a local config starts no TensorFlow)

    return tf.io.gfile


def path_exists(path: str) -> bool:
    """Whether a local path or a tf.io.gfile URL (gs://...) exists; only a URL imports TensorFlow."""
    return _gfile().exists(path) if _is_url(path) else os.path.exists(_local(path))


def path_is_dir(path: str) -> bool:
    """Whether a local path or a tf.io.gfile URL is a directory; only a URL imports TensorFlow."""
    return _gfile().isdir(path) if _is_url(path) else os.path.isdir(_local(path))


def read_text(path: str) -> str:
    """A UTF-8 file's text, line endings untouched (as tf.io.gfile.GFile reads it); only a URL imports TensorFlow."""
    if _is_url(path):
        with _gfile().GFile(path, "r") as handle:
            return handle.read()
    with open(_local(path), encoding="utf-8", newline="") as handle:
        return handle.read()


def default_cache_dir() -> str:
    """$TPU_PIPELINE_CACHE, else ~/.cache/tpu_pipeline: the demo data, benchmarks' data and verified-file results."""
    return os.environ.get("TPU_PIPELINE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tpu_pipeline")


def available_cores() -> int:
    """Cores this process may run on (affinity-aware, so containers and taskset are respected)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def available_memory_bytes() -> int:
    """Memory the OS could give this process now without swapping (what a cache may take a share of)."""
    import psutil  # noqa: PLC0415 (only the callers that size caches need it)

    return int(psutil.virtual_memory().available)


@contextlib.contextmanager
def native_stderr_silenced(enabled: bool = True) -> Iterator[None]:
    """Sends file descriptor 2 to /dev/null inside the block: TensorFlow's C++ start-up lines (oneDNN,
    CUDA stubs, `failed call to cuInit` on CPU machines) are written before its log level applies,
    so TF_CPP_MIN_LOG_LEVEL cannot hide them. Python exceptions still reach the caller."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
