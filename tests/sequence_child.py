"""A child process for the SIGKILL test of tests/test_sequence_pipelines.py; run as a script.

    sequence_child.py CONFIG_JSON OUT_DIR

Iterates `pipeline.iterator()` over a packed pipeline (data.sequence mode pack) to the end. For each
step s it appends `s id id ...` to OUT_DIR/ids.log (the example of each segment of the batch, rows in
order, decoded from the tokens), flushed to disk, THEN checkpoints the step and the iterator. A kill
between the two leaves a line for a step the checkpoint does not count: on restart the log is cut
back to the checkpointed step (the lines cut are kept in OUT_DIR/redone.log, so the test can check
that the redone steps saw the same examples). A kill during the checkpoint leaves the previous one
as the latest (tf.train.CheckpointManager writes its index last).
"""
from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

TOKEN_BASE = 1000  # token j of example i is i * TOKEN_BASE + j (j < TOKEN_BASE), or 0 where j % 5 == 2


def tokens_of(example: int, count: int) -> list[int]:
    """The tokens of `example`, `count` of them: token 0 is a real token in most examples."""
    return [0 if j % 5 == 2 else example * TOKEN_BASE + j for j in range(count)]


def segment_ids(batch) -> list[int]:
    """The example of each segment of a packed batch (rows in order, segments in order): its largest
    token // TOKEN_BASE (a segment of zeros only is example 0's)."""
    out = []
    for tokens, segments in zip(np.asarray(batch["tokens"]), np.asarray(batch["tokens_segment_ids"])):
        for segment in range(1, int(segments.max(initial=0)) + 1):
            out.append(int(tokens[segments == segment].max()) // TOKEN_BASE)
    return out


def cut_log(out_dir: str, steps: int) -> None:
    """ids.log back to its lines for steps < `steps` (complete lines only); the rest to redone.log."""
    path = os.path.join(out_dir, "ids.log")
    if not os.path.exists(path):
        return
    lines = [line for line in open(path).read().split("\n")[:-1]]  # the last piece: a line cut short, or ""
    keep = [line for line in lines if int(line.split()[0]) < steps]
    with open(os.path.join(out_dir, "redone.log"), "a") as handle:
        handle.writelines(line + "\n" for line in lines if int(line.split()[0]) >= steps)
    with open(path + ".tmp", "w") as handle:
        handle.writelines(line + "\n" for line in keep)
    os.replace(path + ".tmp", path)


def run(config_path: str, out_dir: str, describe) -> None:
    """Iterates the config's pipeline to the end: each step's `describe(batch)` logged, flushed, THEN checkpointed."""
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
            log.write(f"{int(step.numpy())} {describe(batch)}\n")
            log.flush()
            os.fsync(log.fileno())
            step.assign_add(1)
            manager.save(checkpoint_number=int(step.numpy()))
            time.sleep(0.03)  # room for the parent to kill anywhere in a step
    print("done", flush=True)


def main(config_path: str, out_dir: str) -> None:
    run(config_path, out_dir, lambda batch: " ".join(map(str, segment_ids({k: v.numpy() for k, v in batch.items()}))))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
