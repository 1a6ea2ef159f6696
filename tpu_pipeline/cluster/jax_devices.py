"""Keras 3 on JAX: the processes, the devices and the `keras.distribution` that trains over them.

`resolve_jax` is the resolver of `model.framework: jax`. It starts `jax.distributed` when there are
several processes (explicit `cluster.coordinator_address` / `num_processes` / `process_id`, JAX's own
JAX_COORDINATOR_ADDRESS variables, or a multi-host Cloud TPU slice, which JAX finds by itself), and
returns a `ClusterInfo` whose strategy is a `JaxDataParallel`: a `keras.distribution.DataParallel`
over every process's devices, plus the few calls the training job makes of a `tf.distribute`
strategy, so the job's input, checkpoint and resume code is one code for both frameworks.

The input stays ours and per host (`auto_shard_dataset=False`): each process builds its own input
pipeline from an `InputContext` (one input pipeline per process), whose elements are per-replica
batches in replica order exactly as a `tf.distribute` strategy takes them; `per_host_batches` joins
each step's local replicas' batches into the process's batch, and Keras makes every such batch one
global `jax.Array` (`jax.make_array_from_process_local_data`), device i of a host taking the i-th
slice. So each device gets the batch the same replica would get on the TF path. The batches reach
Keras as read-only numpy views, not Keras's copies (`cluster/jax_input.py`).

Only here does the cluster layer import JAX and Keras 3, and only when the JAX path is taken.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Callable, Mapping, Optional

import tensorflow as tf

from tpu_pipeline.cluster.info import ClusterInfo
from tpu_pipeline.config.cluster import ClusterConfig
from tpu_pipeline.errors import ClusterError

_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
# Multi-host Cloud TPU slices: JAX's own auto-detection finds the coordinator from the TPU metadata.
_TPU_HOSTS_VARIABLE = "TPU_WORKER_HOSTNAMES"


@dataclasses.dataclass(frozen=True)
class JaxDataParallel:
    """A `keras.distribution.DataParallel` with the strategy calls the training job makes.

    Not a `tf.distribute.Strategy`: `scope()` is the distribution's, and
    `distribute_datasets_from_function` returns this process's batches as the Keras data adapter that
    hands them to Keras's JAX trainer as read-only views (`cluster/jax_input.py`), which it makes global
    arrays.
    """

    distribution: Any  # keras.distribution.DataParallel
    num_replicas_in_sync: int  # devices of every process
    num_processes: int
    process_index: int
    local_devices: int

    def scope(self) -> Any:
        return self.distribution.scope()

    def input_context(self) -> tf.distribute.InputContext:
        """This process's input pipeline: one per process, feeding its local devices."""
        return tf.distribute.InputContext(num_input_pipelines=self.num_processes,
                                          input_pipeline_id=self.process_index,
                                          num_replicas_in_sync=self.num_replicas_in_sync)

    def distribute_datasets_from_function(self, dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset],
                                          options: Any = None) -> Any:
        """This process's batches: `dataset_fn`'s per-replica batches, each step's local ones joined, in
        the adapter `fit` and `evaluate` take (iterating it yields the tf batches; `.dataset` is theirs)."""
        from tpu_pipeline.cluster.jax_input import host_batches

        return host_batches(per_host_batches(dataset_fn(self.input_context()), self.local_devices))

    def experimental_local_results(self, value: Any) -> tuple[Any, ...]:
        return (value,)


def per_host_batches(dataset: tf.data.Dataset, replicas: int) -> tf.data.Dataset:
    """`replicas` consecutive per-replica batches joined along the batch axis, in order: replica i's
    rows are the i-th slice, which `make_array_from_process_local_data` places on local device i."""
    if replicas == 1:
        return dataset

    def joined(*parts: Any) -> Any:
        return tf.nest.map_structure(lambda part: tf.reshape(part, tf.concat([[-1], tf.shape(part)[2:]], 0)),
                                     parts[0] if len(parts) == 1 else parts)

    return dataset.batch(replicas, drop_remainder=True).map(joined, num_parallel_calls=tf.data.AUTOTUNE,
                                                            deterministic=True)


def resolve_jax(config: Optional[ClusterConfig] = None, *, env: Mapping[str, str] = os.environ) -> ClusterInfo:
    """The ClusterInfo of the JAX path: `jax.distributed` started where there are several processes,
    then a data-parallel `keras.distribution` over `jax.devices()`."""
    config = config or ClusterConfig()
    _set_cpu_devices(config)
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax
    import keras

    if keras.backend.backend() != "jax":
        raise ClusterError(f"model.framework is jax, but this process imported Keras 3 with the "
                           f"{keras.backend.backend()} backend first; set KERAS_BACKEND=jax before Python starts")
    source = _start_processes(config, env, jax, keras)
    platform = jax.default_backend()
    wanted = {"auto": None, "tpu": "tpu", "gpu": "gpu", "cpu": "cpu", "multi_worker": None}[config.accelerator]
    if wanted is not None and platform != wanted:
        raise ClusterError(f"cluster.accelerator={config.accelerator}, but JAX runs on {platform} here "
                           f"(jax.devices(): {_names(jax.devices())}); install jax[{wanted}] or set cluster.accelerator: auto")
    if config.cpu_replicas > 1 and platform == "cpu" and len(jax.local_devices()) != config.cpu_replicas:
        raise ClusterError(
            f"cluster.cpu_replicas={config.cpu_replicas}, but JAX already started with {len(jax.local_devices())} CPU "
            f"device(s) (set before any JAX computation, or XLA_FLAGS={_DEVICE_COUNT_FLAG}={config.cpu_replicas})")
    devices = jax.devices()
    distribution = keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)
    keras.distribution.set_distribution(distribution)
    strategy = JaxDataParallel(distribution=distribution, num_replicas_in_sync=len(devices),
                               num_processes=jax.process_count(), process_index=jax.process_index(),
                               local_devices=len(jax.local_devices()))
    return ClusterInfo(strategy=strategy, kind=platform if platform in ("tpu", "gpu") else "cpu",
                       num_replicas=len(devices), num_hosts=jax.process_count(),
                       devices=tuple(_names(jax.local_devices())), source=source,
                       worker_id=jax.process_index(), is_chief=jax.process_index() == 0, framework="jax")


def _names(devices: Any) -> list[str]:
    return [f"{device.platform}:{device.id}" for device in devices]


def _set_cpu_devices(config: ClusterConfig) -> None:
    """cluster.cpu_replicas on JAX: the host platform's device count, which XLA reads once, at JAX's start."""
    if config.cpu_replicas <= 1:
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if _DEVICE_COUNT_FLAG in flags:
        return  # the environment said it; resolve_jax checks the count JAX started with
    os.environ["XLA_FLAGS"] = f"{flags} {_DEVICE_COUNT_FLAG}={config.cpu_replicas}".strip()


def _start_processes(config: ClusterConfig, env: Mapping[str, str], jax: Any, keras: Any) -> str:
    """Starts `jax.distributed` when this is one of several processes; where that came from, for the log."""
    if jax.distributed.is_initialized():
        return "jax.distributed (already started)"
    explicit = {key: getattr(config, key) for key in ("coordinator_address", "num_processes", "process_id")}
    if any(value is not None for value in explicit.values()):
        missing = [f"cluster.{key}" for key, value in explicit.items() if value is None]
        if missing:
            raise ClusterError(f"cluster.coordinator_address, num_processes and process_id go together; set "
                               f"{', '.join(missing)} too")
        if explicit["num_processes"] == 1:
            return "cluster.num_processes=1"
        _initialize(keras, **explicit)
        return f"jax.distributed, coordinator {explicit['coordinator_address']}"
    if env.get("JAX_COORDINATOR_ADDRESS"):
        _initialize(keras, coordinator_address=env["JAX_COORDINATOR_ADDRESS"],
                    num_processes=_int_env(env, "JAX_NUM_PROCESSES"), process_id=_int_env(env, "JAX_PROCESS_ID"))
        return f"jax.distributed, JAX_COORDINATOR_ADDRESS={env['JAX_COORDINATOR_ADDRESS']}"
    if len([host for host in re.split(r"[,\s]+", env.get(_TPU_HOSTS_VARIABLE, "")) if host]) > 1:
        _initialize(keras)  # a multi-host TPU slice: JAX reads the coordinator from the TPU environment
        return f"jax.distributed, the TPU slice's {_TPU_HOSTS_VARIABLE}"
    return "one JAX process"


def _int_env(env: Mapping[str, str], name: str) -> Optional[int]:
    value = env.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ClusterError(f"{name}={value!r} is not a number") from None


def _initialize(keras: Any, coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
                process_id: Optional[int] = None) -> None:
    """Keras's own start of the processes: `jax.distributed.initialize`, then one random seed agreed by all
    (without it each process would initialize the weights differently, and JAX refuses to place them)."""
    try:
        keras.distribution.initialize(coordinator_address, num_processes, process_id)
    except (RuntimeError, ValueError) as error:
        raise ClusterError(f"jax.distributed.initialize failed ({str(error).splitlines()[0][:300]}); check "
                           "cluster.coordinator_address (host:port of process 0, reachable from every process), "
                           "cluster.num_processes and cluster.process_id") from None

