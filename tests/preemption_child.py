"""A child process for the kill-and-resume tests (tests/test_preemption.py); run as a script.

    preemption_child.py loop  CONFIG_JSON OUT_DIR STEPS   # 2 input pipelines, our iterators, a custom loop
    preemption_child.py train CONFIG_JSON OUT_DIR         # `train` (8 CPU replicas, or a TF_CONFIG worker)
    preemption_child.py train_lm CONFIG_JSON OUT_DIR      # `train` of a language model on packed rows
    preemption_child.py train_jax CONFIG_JSON OUT_DIR     # `train` on Keras 3 JAX (KERAS_BACKEND=jax, 8 devices)
    preemption_child.py train_lm_jax CONFIG_JSON OUT_DIR  # the language model on Keras 3 JAX
    preemption_child.py train_digest CONFIG_JSON OUT_DIR  # `train`, logging a digest of each replica's batch
                                                          # (augmented images, soft targets) instead of ids

Each appends one line per training step to OUT_DIR/ids.log: `step pipeline-or-replica id id ...`.
A killed child leaves lines for steps after its last checkpoint; the next child redoes those
steps, so the test keeps the last line written for each (step, part) and also checks that the
redone steps saw the same ids.

`train` also appends what it does, in the order done, to OUT_DIR/events.log, one line each:
`train STEP` (a training step begins), `eval STEP` (a validation or evaluation step begins),
`sigterm` (the handler saw the signal), `save STEP` (a checkpoint written), `metrics STEP`
(metrics.json written), and `exit CODE` (the command returned; the process exits with CODE).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if not (__name__ == "__main__" and sys.argv[1].endswith("_jax")):  # (also imported by tests, for its helpers)
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402

from tpu_pipeline.config import config_from_dict  # noqa: E402


_EVENTS = threading.Lock()


def event(out_dir: str, what: str) -> None:
    """One line of events.log (py_function threads and the main thread write it, one line at a time)."""
    with _EVENTS, open(os.path.join(out_dir, "events.log"), "a") as handle:
        handle.write(what + "\n")


def log_line(out_dir: str, step: int, part: int, ids) -> None:
    # One file per process (IDS_LOG), so that processes training together never interleave lines.
    with open(os.path.join(out_dir, os.environ.get("IDS_LOG", "ids.log")), "a") as handle:
        handle.write(f"{step} {part} {' '.join(str(int(i)) for i in ids)}\n")


def loop(config_path: str, out_dir: str, steps: int) -> None:
    """Two simulated input pipelines in one process, each an iterator saved in the checkpoint."""
    from tpu_pipeline.pipeline import Pipeline

    config = config_from_dict(json.load(open(config_path)))
    pipeline = Pipeline.from_config(config.data)
    iterators = [pipeline.iterator(tf.distribute.InputContext(2, index, 2)) for index in range(2)]
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(step=step, data0=iterators[0], data1=iterators[1])
    manager = tf.train.CheckpointManager(checkpoint, os.path.join(out_dir, "checkpoints"), max_to_keep=2)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_consumed()
        print(f"restored step {int(step.numpy())}", flush=True)
    while int(step.numpy()) < steps:
        for index, iterator in enumerate(iterators):
            log_line(out_dir, int(step.numpy()), index, next(iterator)["id"].numpy())
        step.assign_add(1)
        if int(step.numpy()) % 3 == 0:
            manager.save(checkpoint_number=int(step.numpy()))
        time.sleep(0.05)  # room for the parent to kill at a chosen step
    print("done", flush=True)


def document_ids(tokens, segment_ids) -> list[int]:
    """The document of each segment of a packed batch (rows in order, segments in order): its text
    starts with the document's number in 5 digits, as byte ids (byte + 3)."""
    import numpy as np

    out = []
    for row, segments in zip(np.asarray(tokens), np.asarray(segment_ids)):
        for segment in range(1, int(segments.max(initial=0)) + 1):
            text = bytes(int(t) - 3 for t in row[segments == segment][:5])
            out.append(int(text.decode()))
    return out


def jax_logging_model(build_model, out_dir: str, language_model: bool):
    """`build_model` whose Keras 3 JAX train_step logs, through `jax.debug.callback`, the ids of each
    device's slice of the global batch (device i holds the i-th slice) at the optimizer's step."""
    import jax
    import numpy as np

    def logging_model(*args, **kwargs):
        model = build_model(*args, **kwargs)
        train_step = model.train_step
        devices = len(jax.devices())
        global_rows = [0]

        def log(step, *ids):
            # The callback is given the global batch (with several processes, on one of them, gathered from
            # all): device d holds its d-th slice. Were it given a process's own rows, they would be its devices'.
            step, ids = int(np.asarray(step)), [np.asarray(x) for x in ids]
            event(out_dir, f"train {step}")
            local = len(jax.local_devices())
            whole = len(ids[0]) == global_rows[0]
            first, count = (0, devices) if whole else (jax.process_index() * local, local)
            for device in range(first, first + count):
                part = [np.split(x, count)[device - first] for x in ids]
                log_line(out_dir, step, device, document_ids(*part) if language_model else part[0])
            time.sleep(0.02 * local)  # room for the parent to kill at a chosen step
            return None

        def step_with_log(state, data):
            optimizer_variables = state[2]
            at = [v.path for v in model.optimizer.variables].index(model.optimizer.iterations.path)
            logged = [data[0]["inputs"], data[0]["inputs_segment_ids"]] if language_model else [data[1]]
            global_rows[0] = logged[0].shape[0]  # traced: the global batch's rows
            jax.debug.callback(log, optimizer_variables[at], *logged)
            return train_step(state, data)

        model.train_step = step_with_log
        return model

    return logging_model


def digest(*tensors) -> list[int]:
    """Two int32s of the SHA-256 of the tensors' bytes: what a replica's batch was, to the bit."""
    import hashlib

    import numpy as np

    sha = hashlib.sha256(b"".join(np.ascontiguousarray(np.asarray(t)).tobytes() for t in tensors)).digest()
    return [int.from_bytes(sha[:4], "little") >> 1, int.from_bytes(sha[4:8], "little") >> 1]


def train(config_path: str, out_dir: str, language_model: bool = False, on_jax: bool = False,
          batch_digest: bool = False) -> None:
    """The real training job, with the model's train_step logging the ids it trains on: the targets,
    or for a language model the documents of the packed inputs' segments, or (`batch_digest`) a digest
    of the inputs and targets themselves."""
    from tpu_pipeline.train import preemption, run_files, runner

    build_model = runner.build_model
    eval_pause = float(os.environ.get("EVAL_STEP_SECONDS", "0"))  # room to signal during a validation

    def logging_model(*args, **kwargs):
        model = build_model(*args, **kwargs)
        train_step, test_step = model.train_step, model.test_step

        def log(step, replica, *ids):
            event(out_dir, f"train {int(step)}")
            ids = document_ids(*ids) if language_model else digest(*ids) if batch_digest else ids[0].numpy()
            log_line(out_dir, int(step), int(replica), ids)
            time.sleep(0.02)  # room for the parent to kill at a chosen step
            return 0

        def step_with_log(data):
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            logged = [data[0]["inputs"], data[0]["inputs_segment_ids"]] if language_model else [data[1]]
            logged = [data[0], data[1]] if batch_digest else logged
            done = tf.py_function(log, [model.optimizer.iterations, replica, *logged], tf.int32)
            with tf.control_dependencies([done]):
                return train_step(data)

        def log_eval(step):
            event(out_dir, f"eval {int(step)}")
            time.sleep(eval_pause)
            return 0

        def test_step_with_log(data):
            done = tf.py_function(log_eval, [model.optimizer.iterations], tf.int32)
            with tf.control_dependencies([done]):
                return test_step(data)

        model.train_step, model.test_step = step_with_log, test_step_with_log
        return model

    save_checkpoint, write_metrics = run_files.RunFiles.save_checkpoint, run_files.RunFiles.write_metrics
    handle = preemption.PreemptionFlag._handle

    def logged_save(self, step):
        path = save_checkpoint(self, step)
        event(out_dir, f"save {step}")
        return path

    def logged_metrics(self, metrics):
        path = write_metrics(self, metrics)
        event(out_dir, f"metrics {metrics['steps']}")
        return path

    def logged_handle(self, signum, frame):
        event(out_dir, "sigterm")
        handle(self, signum, frame)

    run_files.RunFiles.save_checkpoint, run_files.RunFiles.write_metrics = logged_save, logged_metrics
    preemption.PreemptionFlag._handle = logged_handle
    runner.build_model = jax_logging_model(build_model, out_dir, language_model) if on_jax else logging_model
    from tpu_pipeline.cli import main

    try:
        main(["tpu-pipeline", "train", "--config", config_path])
    except SystemExit as done:
        event(out_dir, f"exit {done.code}")
        raise


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "loop":
        loop(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        train(sys.argv[2], sys.argv[3], language_model=mode.startswith("train_lm"), on_jax=mode.endswith("_jax"),
              batch_digest=mode == "train_digest")
