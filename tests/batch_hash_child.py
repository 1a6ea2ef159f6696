"""A child process for SIGKILL tests of pipelines whose batches are any nest of arrays; run as a script.

    batch_hash_child.py CONFIG_JSON OUT_DIR

Iterates `pipeline.iterator()` to the end. For each step s it appends `s SHA256` (of every array of the batch, in
nest order, with its shape and dtype) to OUT_DIR/ids.log, flushed to disk, THEN checkpoints the step and the
iterator; a restart cuts the log back to the checkpointed step: sequence_child.py's `run`.
"""
from __future__ import annotations

import hashlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from sequence_child import run  # noqa: E402


def batch_hash(batch) -> str:
    import tensorflow as tf

    digest = hashlib.sha256()
    for value in tf.nest.flatten(batch):
        array = np.asarray(value)
        digest.update(f"{array.shape}{array.dtype}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:16]


def main(config_path: str, out_dir: str) -> None:
    run(config_path, out_dir, batch_hash)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
