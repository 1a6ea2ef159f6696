"""One call that finds the accelerator and returns the right `tf.distribute` strategy.

`resolve()` tries a TPU first (explicit name, TPU_NAME, COLAB_TPU_ADDR, a TPU VM), then a
TF_CONFIG cluster with several workers, then GPUs, then the CPU. A TPU that is meant (asked for,
named by cluster.tpu or TPU_NAME, or attached) and does not answer is an error, never the CPU.
The decision among the last three (`choose_kind`) is a pure function, kept apart from building the
strategy, because a multi-worker strategy blocks until its peers join and so cannot be built in a
unit test.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Mapping

import tensorflow as tf

from tpu_pipeline.cluster import tpu as tpu_lib
from tpu_pipeline.cluster import tpu_stack
from tpu_pipeline.cluster.info import ClusterInfo, Kind
from tpu_pipeline.config.cluster import ClusterConfig
from tpu_pipeline.errors import ClusterError

log = logging.getLogger(__name__)

def resolve(
    config: ClusterConfig | None = None,
    *,
    env: Mapping[str, str] = os.environ,
    tpu_backend: tpu_lib.TpuBackend | None = None,
    framework: str = "tensorflow",
) -> ClusterInfo:
    """Finds the accelerator and builds its strategy. Safe to call twice: a TPU is initialized once.

    Call it at program start, before other TensorFlow ops: splitting the CPU into logical devices
    and starting a multi-worker cluster are only possible before TensorFlow initializes.
    `framework='jax'` (model.framework): JAX's devices and a `keras.distribution` instead (`jax_devices`).
    """
    config = config or ClusterConfig()
    if framework == "jax":
        from tpu_pipeline.cluster.jax_devices import resolve_jax  # imports JAX: only on that path

        return resolve_jax(config, env=env)
    for key in ("coordinator_address", "num_processes", "process_id"):
        if getattr(config, key) is not None:
            raise ClusterError(f"cluster.{key} is for model.framework jax (jax.distributed); a TensorFlow cluster "
                               "of several workers is described by TF_CONFIG")
    backend = tpu_backend or tpu_lib.DEFAULT_BACKEND
    if config.accelerator in ("auto", "tpu"):
        info = _resolve_tpu(config, env, backend)
        if info is not None:
            return info
    gpus = [] if config.accelerator == "cpu" else tf.config.list_physical_devices("GPU")
    kind = choose_kind(config, env, num_gpus=len(gpus))
    if kind == "multi-worker":
        return _multi_worker(config, env, num_gpus=len(gpus))
    if kind == "gpu":
        return _gpu(config)
    return _cpu(config)


def check_tpu_stack(config: ClusterConfig | None = None, *, env: Mapping[str, str] = os.environ,
                    tpu_backend: tpu_lib.TpuBackend | None = None) -> None:
    """The resolver's dead-end check alone, without building a strategy: a ClusterError (one line) when a TPU
    of this machine is meant but this process cannot drive it. For commands that measure before they resolve
    (`doctor`), so the dead end is named before anything runs."""
    config = config or ClusterConfig()
    if config.accelerator not in ("auto", "tpu"):
        return
    backend = tpu_backend or tpu_lib.DEFAULT_BACKEND
    device = backend.local_tpu_evidence() if config.tpu in (None, tpu_stack.LOCAL) else None
    local = tpu_stack.local_tpu(config, env, device)
    dead_end = tpu_stack.dead_end(local, backend.tensorflow_stack()) if local else None
    if dead_end:
        raise ClusterError(dead_end)


def _resolve_tpu(config: ClusterConfig, env: Mapping[str, str], backend: tpu_lib.TpuBackend) -> ClusterInfo | None:
    """A TPU's ClusterInfo; None when auto mode found none; a ClusterError when one was required (by
    cluster.accelerator, cluster.tpu or the TPU_NAME env var), or when a TPU of this machine is meant
    (named 'local' or attached) but this process cannot drive it or none connected: a billed TPU is never
    left idle for the CPU without a word (cluster.accelerator=cpu says so)."""
    device = backend.local_tpu_evidence() if config.tpu in (None, tpu_stack.LOCAL) else None
    local = tpu_stack.local_tpu(config, env, device)
    attached = local.attached if local else None
    candidates, notes = tpu_lib.tpu_candidates(config, env, attached)
    dead_end = tpu_stack.dead_end(local, backend.tensorflow_stack()) if local else None
    if dead_end:  # remote TPUs (tried first) need no TPU kernels here; this machine's would fail
        candidates = [candidate for candidate in candidates if candidate.tpu != tpu_stack.LOCAL]
    connection, failures = tpu_lib.try_tpus(candidates, backend)
    if connection is not None:
        return _tpu_info(connection)
    if dead_end:
        raise ClusterError(dead_end)
    named = env.get("TPU_NAME", "").strip()  # Cloud's scripts name the TPU to use this way: it is meant too
    if config.accelerator == "tpu" or config.tpu or local or named:
        raise ClusterError(tpu_lib.no_tpu_message(config, failures, notes, local.why if local else None, named))
    if failures:
        log.warning("no TPU found, falling back:\n  %s", "\n  ".join(failures))
    return None


def _tpu_info(connection: tpu_lib.TpuConnection) -> ClusterInfo:
    strategy = connection.strategy
    return ClusterInfo(
        strategy=strategy,
        kind="tpu",
        num_replicas=strategy.num_replicas_in_sync,
        num_hosts=tpu_lib.tpu_num_hosts(connection),
        devices=tuple(strategy.extended.worker_devices),
        tpu=connection.candidate.tpu,
        source=connection.candidate.source,
    )


def _tf_config_kind(config: ClusterConfig, env: Mapping[str, str]) -> Kind:
    """A TF_CONFIG cluster; keys that apply only to one CPU host are refused, never ignored."""
    if config.cpu_replicas > 1:
        raise ClusterError(
            f"cluster.cpu_replicas={config.cpu_replicas} splits one CPU host into replicas, but TF_CONFIG names "
            f"{num_workers(parse_tf_config(env))} workers (MultiWorkerMirroredStrategy over each worker's own "
            "devices); remove cluster.cpu_replicas, or unset TF_CONFIG to train on this host alone"
        )
    return "multi-worker"


def split_cpu_early(config: ClusterConfig, *, env: Mapping[str, str] = os.environ,
                    tpu_backend: tpu_lib.TpuBackend | None = None) -> None:
    """cluster.cpu_replicas > 1 where `resolve` will choose the CPU: split it now, so that a command's
    TensorFlow ops before `resolve` (the built-in demo's JPEG encoder, on a fresh machine) do not start
    TensorFlow with one CPU device. Anything else (a TPU or GPU to look for, a TF_CONFIG, an error in the
    section) is left to `resolve`, which says it in its own line."""
    if config.cpu_replicas == 1:
        return
    if config.accelerator == "auto":
        device = (tpu_backend or tpu_lib.DEFAULT_BACKEND).local_tpu_evidence() if config.tpu is None else None
        if tpu_lib.tpu_candidates(config, env, device)[0] or tf.config.list_physical_devices("GPU"):
            return
    try:
        kind = choose_kind(config, env, num_gpus=0)
    except ClusterError:
        return
    if kind == "cpu":
        logical_cpus(config.cpu_replicas)


def choose_kind(config: ClusterConfig, env: Mapping[str, str], *, num_gpus: int) -> Kind:
    """Which non-TPU strategy to build (called once no TPU was chosen). Pure: builds nothing.

    auto: TF_CONFIG with more than one worker, then GPUs, then the CPU.
    """
    if config.accelerator == "tpu":
        raise ClusterError("choose_kind is for the non-TPU accelerators; cluster.accelerator is 'tpu'")
    if config.accelerator == "cpu":
        return "cpu"
    if config.accelerator == "multi_worker":
        if "TF_CONFIG" not in env:
            raise ClusterError(
                "cluster.accelerator is 'multi_worker' but the TF_CONFIG env var is not set. "
                "Fix: set TF_CONFIG on every worker (https://www.tensorflow.org/guide/distributed_training"
                "#setting_up_the_tf_config_environment_variable), or use cluster.accelerator=auto."
            )
        parse_tf_config(env)
        return _tf_config_kind(config, env)
    if config.accelerator == "gpu":
        if num_gpus == 0:
            raise ClusterError(
                "cluster.accelerator is 'gpu' but TensorFlow sees no GPU "
                f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r}). Fix: install a "
                "CUDA-enabled TensorFlow (pip install 'tensorflow[and-cuda]'), check nvidia-smi and "
                "CUDA_VISIBLE_DEVICES, or use cluster.accelerator=auto."
            )
        return "gpu"
    if num_workers(parse_tf_config(env)) > 1:
        return _tf_config_kind(config, env)
    # cluster.gpus names GPUs: with none visible, fail on them rather than train on the CPU.
    return "gpu" if num_gpus > 0 or config.gpus is not None else "cpu"


def parse_tf_config(env: Mapping[str, str]) -> dict[str, Any]:
    """TF_CONFIG as a dict ({} when unset); a ClusterError naming TF_CONFIG when it is malformed."""
    raw = env.get("TF_CONFIG", "").strip()
    if not raw:
        return {}
    try:
        tf_config = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ClusterError(f"the TF_CONFIG env var is not valid JSON ({error}). Fix: export it as "
                           '\'{"cluster": {"worker": ["host1:port", ...]}, "task": {"type": "worker", "index": 0}}\'') from None
    cluster = tf_config.get("cluster", {}) if isinstance(tf_config, dict) else None
    if not isinstance(cluster, dict) or not all(isinstance(v, list) for v in cluster.values()):
        raise ClusterError("the TF_CONFIG env var must be a JSON object whose 'cluster' maps job names "
                           'to lists of "host:port" addresses, e.g. {"cluster": {"worker": ["h1:2222", "h2:2222"]}, '
                           '"task": {"type": "worker", "index": 0}}')
    if "ps" in cluster:
        raise ClusterError("the TF_CONFIG env var has a 'ps' job: parameter-server training is not "
                           "supported here. Fix: list only 'chief' and 'worker' tasks for "
                           "MultiWorkerMirroredStrategy.")
    return tf_config


def num_workers(tf_config: Mapping[str, Any]) -> int:
    """Workers that train (and each run an input pipeline): 'chief' plus 'worker' tasks."""
    cluster = tf_config.get("cluster", {})
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def _multi_worker(config: ClusterConfig, env: Mapping[str, str], num_gpus: int) -> ClusterInfo:
    """MultiWorkerMirroredStrategy from the TF_CONFIG in `env` (not only os.environ)."""
    if config.gpus is not None:
        raise ClusterError("cluster.gpus is not supported with a multi-worker TF_CONFIG cluster: every "
                           "worker uses all its visible GPUs. Fix: drop cluster.gpus and set "
                           "CUDA_VISIBLE_DEVICES on each worker instead.")
    tf_config = parse_tf_config(env)
    task = tf_config.get("task") or {}
    if "type" not in task or "index" not in task:
        raise ClusterError("the TF_CONFIG env var has no 'task' with 'type' and 'index' (e.g. "
                           '"task": {"type": "worker", "index": 0}). Fix: give each worker its own task.')
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(tf_config["cluster"]),
        task_type=task["type"],
        task_id=int(task["index"]),
        rpc_layer=tf_config.get("rpc_layer", "grpc"),
        num_accelerators={"GPU": num_gpus},
    )
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    except (RuntimeError, ValueError) as error:
        raise ClusterError(
            f"could not start the multi-worker cluster from TF_CONFIG ({tpu_lib.short_error(error)}). "
            "Fix: call tpu_pipeline.cluster.resolve() at program start, before any other "
            "TensorFlow op; collective ops can only be configured before TensorFlow initializes."
        ) from error
    return ClusterInfo(
        strategy=strategy,
        kind="multi-worker",
        num_replicas=strategy.num_replicas_in_sync,
        num_hosts=max(num_workers(tf_config), 1),
        devices=tuple(strategy.extended.worker_devices),
        source="TF_CONFIG env var",
        worker_id=worker_id(tf_config),
        is_chief=bool(strategy.extended.should_checkpoint),
    )


def worker_id(tf_config: Mapping[str, Any]) -> int:
    """This task's index among the training processes: the 'chief' task first, then 'worker' tasks."""
    task = tf_config.get("task") or {}
    has_chief = bool(tf_config.get("cluster", {}).get("chief"))
    if task.get("type") == "chief":
        return 0
    return int(task.get("index", 0)) + (1 if has_chief else 0)


def _gpu(config: ClusterConfig) -> ClusterInfo:
    """MirroredStrategy over the visible GPUs (TF already honours CUDA_VISIBLE_DEVICES), or cluster.gpus."""
    visible = [d.name for d in tf.config.list_logical_devices("GPU")]
    if config.gpus is None:
        devices = visible
    else:
        missing = [i for i in config.gpus if i >= len(visible)]
        if missing:
            raise ClusterError(
                f"cluster.gpus={config.gpus} names GPU {missing[0]} but only {len(visible)} are visible "
                "(indices count the GPUs left by CUDA_VISIBLE_DEVICES). Fix: use indices "
                f"0..{len(visible) - 1} or drop cluster.gpus."
            )
        devices = [visible[i] for i in config.gpus]
    return _one_host(mirrored_strategy(devices), "gpu", "cluster.gpus" if config.gpus is not None else "visible GPUs",
                     memory=_memory(devices))


def _one_host(strategy: tf.distribute.MirroredStrategy, kind: Kind, source: str,
              memory: Mapping[str, Mapping[str, int]] | None = None) -> ClusterInfo:
    """A MirroredStrategy on this host: replicas and devices are the strategy's own."""
    return ClusterInfo(
        strategy=strategy, kind=kind, num_replicas=strategy.num_replicas_in_sync, num_hosts=1,
        devices=tuple(strategy.extended.worker_devices), memory=memory, source=source,
    )


def _memory(devices: list[str]) -> dict[str, dict[str, int]] | None:
    """Memory in use per device, where TF can tell (GPUs); None otherwise."""
    memory = {}
    for device in devices:
        try:
            memory[device] = dict(tf.config.experimental.get_memory_info(device))
        except (ValueError, RuntimeError, tf.errors.OpError):
            return None
    return memory or None


def _cpu(config: ClusterConfig) -> ClusterInfo:
    """The default strategy, or a MirroredStrategy over cluster.cpu_replicas logical CPUs."""
    if config.cpu_replicas == 1:
        strategy = tf.distribute.get_strategy()
        first_cpu = tf.config.list_logical_devices("CPU")[0].name
        return ClusterInfo(strategy=strategy, kind="cpu", num_replicas=1, num_hosts=1,
                           devices=(first_cpu,))
    return _one_host(mirrored_strategy(logical_cpus(config.cpu_replicas)), "cpu", "cluster.cpu_replicas")


_MIRRORED: dict[tuple[str, ...], tf.distribute.MirroredStrategy] = {}


def mirrored_strategy(devices: list[str]) -> tf.distribute.MirroredStrategy:
    """One MirroredStrategy per device set per process.

    Two strategies over the same devices number their collective all-reduces alike, so the second
    one's first all-reduce can meet a cached one of the first with another shape ("Shape mismatch
    in the collective instance 100"). Re-running a notebook cell that resolves must not do that.
    """
    key = tuple(devices)
    if key not in _MIRRORED:
        _MIRRORED[key] = tf.distribute.MirroredStrategy(list(devices))
    return _MIRRORED[key]


def logical_cpus(count: int) -> list[str]:
    """Names of `count` logical CPU devices, splitting the CPU if TensorFlow has not started yet."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    configured = tf.config.get_logical_device_configuration(cpu)
    if configured is not None and len(configured) != count:
        raise ClusterError(
            f"cluster.cpu_replicas={count}, but the CPU was already split into {len(configured)} "
            "logical devices by an earlier tf.config.set_logical_device_configuration call. Fix: set "
            f"cluster.cpu_replicas={len(configured)}, or remove the earlier split."
        )
    if configured is None:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
            )
        except RuntimeError:
            raise ClusterError(
                f"cluster.cpu_replicas={count} needs {count} logical CPU devices, but TensorFlow was "
                "already initialized with 1 (a TensorFlow op ran before resolve()). Fix: call "
                "tpu_pipeline.cluster.resolve() at program start, before any other TensorFlow op, "
                "or set cluster.cpu_replicas=1."
            ) from None
    return [d.name for d in tf.config.list_logical_devices("CPU")]
