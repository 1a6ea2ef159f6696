"""What each training process writes into `train.run_dir`, and where.

One process (one host, or a TPU pod slice driven by one TPUStrategy client) owns the run
directory. With several TF_CONFIG workers sharing one `run_dir` (a `gs://` path every host sees),
TF's multi-worker rule applies: every worker saves each checkpoint (a save may run collective ops,
so all must take part), but only the chief's files are kept; the others write into a temporary
directory of their own and remove it after each save. Only the chief writes `metrics.json`;
Keras's TensorBoard callback already keeps its logs to the chief. Every worker restores from the
chief's directory, so all resume at the same step.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

import tensorflow as tf

from tpu_pipeline.cluster import ClusterInfo
from tpu_pipeline.cluster.coordination import KeyValueStore
from tpu_pipeline.errors import ClusterError


class RunFiles:
    def __init__(self, run_dir: str, cluster: ClusterInfo, checkpoint: tf.train.Checkpoint, max_to_keep: int) -> None:
        self.run_dir = run_dir
        self.is_chief = cluster.is_chief
        self.checkpoint_dir = os.path.join(run_dir, "checkpoints")
        self.manager = tf.train.CheckpointManager(checkpoint, self.checkpoint_dir, max_to_keep=max_to_keep)
        self._temp_dir: Optional[str] = None
        self._write_manager = self.manager
        if not self.is_chief:
            self._temp_dir = os.path.join(run_dir, f".worker-{cluster.worker_id}-tmp")
            self._write_manager = tf.train.CheckpointManager(checkpoint, self._temp_dir, max_to_keep=1)

    @property
    def latest_checkpoint(self) -> Optional[str]:
        """The chief's newest checkpoint: what every worker restores."""
        return self.manager.latest_checkpoint

    def save_checkpoint(self, step: int) -> str:
        """Saves on this process; returns the path of the kept (the chief's) checkpoint."""
        path = self._write_manager.save(checkpoint_number=step)
        if self._temp_dir is not None:
            tf.io.gfile.rmtree(self._temp_dir)
            return os.path.join(self.checkpoint_dir, os.path.basename(path))
        return path

    @property
    def metrics_path(self) -> str:
        return metrics_path(self.run_dir)

    def write_metrics(self, metrics: dict[str, Any]) -> Optional[str]:
        """metrics.json on the chief (others return None): via a temporary file, so a reader never sees half of it."""
        if not self.is_chief:
            return None
        path = self.metrics_path
        with tf.io.gfile.GFile(path + ".tmp", "w") as handle:
            handle.write(json.dumps(metrics, indent=2, sort_keys=True))
        tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
        return path


def metrics_path(run_dir: str) -> str:
    return os.path.join(run_dir, "metrics.json")


def read_metrics(run_dir: str) -> Optional[dict[str, Any]]:
    """A finished run's metrics.json, or None when it has none."""
    path = metrics_path(run_dir)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path, "r") as handle:
        return json.loads(handle.read())


def check_same_restore(store: KeyValueStore, cluster: ClusterInfo, run_key: str, restored: Optional[str]) -> None:
    """Every worker must restore the same checkpoint (or none): else their steps, weights and input
    positions differ and the first collective fails far from the cause. The usual cause is a
    `run_dir` on each host's own disk instead of one directory all of them see."""
    key = f"tpu_pipeline/{run_key}/restored"
    store.set(f"{key}/{cluster.worker_id}", restored or "")
    seen = {worker: store.get(f"{key}/{worker}") for worker in range(cluster.num_workers)}
    if len(set(seen.values())) > 1:
        found = "; ".join(f"worker {w}: {path or 'no checkpoint'}" for w, path in seen.items())
        raise ClusterError(
            f"train.run_dir: the workers found different checkpoints to resume from ({found}). Every worker "
            "must see the same run_dir: use one shared directory (e.g. gs://bucket/run), not a local path per host"
        )
