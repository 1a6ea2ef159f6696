"""A child process for SIGKILL tests of pipelines whose batches are any nest of arrays; run as a script.

    batch_hash_child.py CONFIG_JSON OUT_DIR

Iterates `pipeline.iterator()` to the end. For each step s it appends `s SHA256` (of every array of the batch, in
nest order, with its shape and dtype) to OUT_DIR/ids.log, flushed to disk, THEN checkpoints the step and the
iterator; a restart cuts the log back to the checkpointed step, as sequence_child.py does (its `cut_log`).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from sequence_child import cut_log  # noqa: E402


def batch_hash(batch) -> str:
    import tensorflow as tf

    digest = hashlib.sha256()
    for value in tf.nest.flatten(batch):
        array = np.asarray(value)
        digest.update(f"{array.shape}{array.dtype}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:16]


def main(config_path: str, out_dir: str) -> None:
    import tensorflow as tf

    from tpu_pipeline.config import config_from_dict
    from tpu_pipeline.pipeline import Pipeline

    pipeline = Pipeline.from_config(config_from_dict(json.load(open(config_path))).data)
    iterator = pipeline.iterator()
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(step=step, data=iterator)
    manager = tf.train.CheckpointManager(checkpoint, os.path.join(out_dir, "checkpoints"), max_to_keep=2)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_consumed()
        print(f"restored at step {int(step.numpy())}", flush=True)
    cut_log(out_dir, int(step.numpy()))
    with open(os.path.join(out_dir, "ids.log"), "a") as log:
        for batch in iterator:
            log.write(f"{int(step.numpy())} {batch_hash(batch)}\n")
            log.flush()
            os.fsync(log.fileno())
            step.assign_add(1)
            manager.save(checkpoint_number=int(step.numpy()))
            time.sleep(0.03)  # room for the parent to kill anywhere in a step
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
