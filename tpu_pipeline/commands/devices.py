"""`tpu-pipeline devices [--config FILE] [cluster.key=value ...]`.

What the resolver finds, as `train` would: the TensorFlow build (CPU / CUDA / TPU) with tf-keras and
libtpu, the kind, replicas, hosts, each device, its memory where TensorFlow can tell (GPUs), and how it
was found (TPU_NAME, TF_CONFIG, visible GPUs, ...). Where a TPU of this machine is meant but this
TensorFlow cannot drive it, the resolver's one-line error says why and the fix. With `model.framework: jax`
(or KERAS_BACKEND=jax) it resolves as `train` would there: JAX's devices and processes, and the
framework line says which JAX and Keras drive them (TensorFlow then only makes the input).
"""
from __future__ import annotations

from typing import Sequence

from tpu_pipeline.commands._common import load


def run(overrides: Sequence[str]) -> int:
    from tpu_pipeline.cluster import current_stack, resolve
    from tpu_pipeline.config.framework import choose_framework
    from tpu_pipeline.model.keras_backend import use_framework
    from tpu_pipeline.tensorflow_install import libtpu_line

    config = load(overrides, check_accelerator=True)
    framework = choose_framework(config.model).framework
    use_framework(framework)
    cluster = resolve(config.cluster, framework=framework)
    stack = current_stack()
    print(f"tensorflow: {stack.describe()}")
    print(libtpu_line(stack.build, stack.install))
    print(f"framework: {_framework_line(framework)}")
    print(f"kind: {cluster.kind}")
    print(f"replicas: {cluster.num_replicas} on {cluster.num_hosts} host(s)"
          + (f"; this is worker {cluster.worker_id}" + (" (the chief)" if cluster.is_chief else "")
             if cluster.num_workers > 1 else ""))
    print(f"strategy: {type(cluster.strategy).__name__.lstrip('_')}" + (f", tpu={cluster.tpu!r}" if cluster.tpu else ""))
    print(f"found from: {cluster.source or 'the default (no TPU, TF_CONFIG or GPU found)'}")
    print("devices:")
    for device in cluster.devices:
        memory = (cluster.memory or {}).get(device)
        where = f"  {device}"
        if memory:
            where += f"  memory in use {memory.get('current', 0) / 2**30:.2f} GiB, peak {memory.get('peak', 0) / 2**30:.2f} GiB"
        print(where)
    if not cluster.memory and framework != "jax":
        print("device memory: TensorFlow reports it for GPUs only")
    return 0


def _framework_line(framework: str) -> str:
    if framework != "jax":
        return "tensorflow (tf.distribute; model.framework: jax or KERAS_BACKEND=jax for Keras 3 on JAX)"
    import jax
    import keras

    return (f"jax {jax.__version__} with Keras {keras.__version__} (keras.distribution.DataParallel on "
            f"{jax.default_backend()}: {len(jax.devices())} device(s) in {jax.process_count()} process(es)); "
            "TensorFlow makes the input")
