"""A distributed iterator's per-device buffers run without tf.data's autotuner, so deleting one is prompt.

Under `MirroredStrategy` and `TPUStrategy`, an iterator over a distributed dataset is a
`MultiDeviceIterator`. The host pipeline (ours, tuned as its own options say) feeds one small tf.data
pipeline per device: a generator over the host's buffer, then `prefetch(per_replica_buffer_size)`.
TensorFlow builds those with default options, so each starts tf.data's autotuning thread, although
nothing in them is tunable (a fixed prefetch over a generator).

That thread is what made deleting such an iterator take up to minutes. Deleting a tf.data iterator runs
`CancellationManager::StartCancel`, which calls the registered callbacks and only then marks itself
cancelled. The autotuner's callback wakes its thread; a thread that wakes before the other callbacks have
run reads "not cancelled" and sleeps out the rest of its period (which doubles up to 60 s), and the
destructor joins it. The device pipelines are deleted one after another, so their waits add up.
Measured (TF 2.21, 2 cores, 8 CPU replicas, an iterator read for 12-15 s then deleted; the case is
`benchmarks/teardown_stall.py`): without this rule 14 of 15 deletions waited, from 5.8 s to 126 s, with
the host pipeline's autotuning on (12 of 12) or off (2 of 3); with it, 10 of 11 took 0.3 s, one 5.8 s.
`teardown_stall.py --runs 12 --rounds 2`: 29.4 s and 250.4 s as TensorFlow builds them, 0.30 s and 0.24 s with
the rule, which also read 8-16% more batches in the same 12 s (eight autotuning threads fewer).
In `train` the wait fell at the end of every `fit` and evaluation on more than one replica, and in a
test process wherever the garbage collector freed an old iterator.

So the per-device pipelines are given `autotune.enabled = False`. TensorFlow has no public way to set
their options: this wraps `multi_device_iterator_ops._create_device_dataset`, the one function that
builds them (the same in TF 2.19 and 2.21), once per process, at import. Where a TensorFlow lacks it,
nothing is changed (the wait comes back, nothing breaks). The host pipeline keeps its autotuning.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

try:  # no public API: the seam is this one module-level function
    from tensorflow.python.data.ops import multi_device_iterator_ops as _multi_device
except ImportError:  # pragma: no cover - present in every TensorFlow we support
    _multi_device = None

_TENSORFLOWS_OWN = getattr(_multi_device, "_create_device_dataset", None)


def _create_untuned_device_dataset(*args: Any, **kwargs: Any) -> tf.data.Dataset:
    options = tf.data.Options()
    options.autotune.enabled = False
    return _TENSORFLOWS_OWN(*args, **kwargs).with_options(options)


def untune_device_buffers(enabled: bool = True) -> bool:
    """Installs the rule (idempotent), or with `enabled=False` puts TensorFlow's own function back
    (`benchmarks/teardown_stall.py` compares the two). False where this TensorFlow has no such function."""
    if _TENSORFLOWS_OWN is None:
        return False
    _multi_device._create_device_dataset = _create_untuned_device_dataset if enabled else _TENSORFLOWS_OWN
    return True


untune_device_buffers()
