"""What a resolver found: `ClusterInfo`, the one record the TF and the JAX resolvers both return."""
from __future__ import annotations

import dataclasses
from typing import Any, Literal, Mapping

Kind = Literal["tpu", "gpu", "multi-worker", "cpu"]


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """What `resolve` found: the strategy and the numbers an input pipeline and a log need."""

    strategy: Any  # a tf.distribute.Strategy, or a jax_devices.JaxDataParallel
    kind: Kind
    num_replicas: int
    num_hosts: int  # input pipelines: one per host (TPU pod slice hosts, or TF_CONFIG workers)
    devices: tuple[str, ...]  # this process's compute devices (all TPU cores for a TPU)
    memory: Mapping[str, Mapping[str, int]] | None = None  # device -> {'current', 'peak'} bytes; GPU only
    tpu: str | None = None  # the TPU address used, for logs
    source: str = ""  # where the choice came from, e.g. 'TPU_NAME env var' or 'cluster.cpu_replicas'
    worker_id: int = 0  # this process among the training processes (TF_CONFIG: chief first, then workers)
    is_chief: bool = True  # writes the run's files; False on the other TF_CONFIG workers
    framework: str = "tensorflow"  # or "jax": `strategy` is then a `jax_devices.JaxDataParallel`

    @property
    def num_workers(self) -> int:
        """Training processes (each runs this same program): TF_CONFIG workers or JAX processes, else 1.
        A TPU pod slice under TPUStrategy is one process here: it drives every host's TPU and input."""
        return self.num_hosts if self.kind == "multi-worker" or self.framework == "jax" else 1

    def describe(self) -> str:
        """One line for logs, e.g. `cluster: tpu, 8 replicas on 1 host (TPUStrategy, tpu='local')`."""
        replicas = f"{self.num_replicas} replica" + ("s" if self.num_replicas != 1 else "")
        hosts = f"{self.num_hosts} host" + ("s" if self.num_hosts != 1 else "")
        extra = [type(self.strategy).__name__.lstrip("_")] + (["Keras 3 on JAX"] if self.framework == "jax" else [])
        if self.tpu:
            extra.append(f"tpu={self.tpu!r}")
        if self.source:
            extra.append(f"from {self.source}")
        if self.num_workers > 1:
            extra.append(f"this is worker {self.worker_id}" + (", the chief" if self.is_chief else ""))
        line = f"cluster: {self.kind}, {replicas} on {hosts} ({', '.join(extra)})"
        line += f"; devices: {_summarize(self.devices)}"
        if self.memory:
            peak = max(m.get("peak", 0) for m in self.memory.values())
            line += f"; peak device memory in use {peak / 2**30:.2f} GiB"
        return line


def _summarize(devices: tuple[str, ...]) -> str:
    """Short device names; long lists as first..last so the line stays one line."""
    short = [d.split("/device:")[-1] if "/device:" in d else d for d in devices]
    if len(short) <= 4:
        return ", ".join(short) or "none"
    return f"{short[0]} .. {short[-1]} ({len(short)})"
