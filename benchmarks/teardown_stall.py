"""How long TensorFlow takes to delete a distributed iterator, with and without our rule (issue 46).

A `MirroredStrategy` iterator is a MultiDeviceIterator: the host pipeline feeds one small tf.data
pipeline per device, which TensorFlow builds with default options, so each runs tf.data's autotuning
thread. Deleting such an iterator waited out those threads' sleeps (a race in TensorFlow's cancellation:
`tpu_pipeline/pipeline/runtime/device_buffers.py` explains it), one device after another: seconds to
minutes. `device_buffers` turns the autotuner off in the per-device pipelines only; this compares.

    .venv/bin/python benchmarks/teardown_stall.py                  # 12 s runs, 3 rounds, each case
    .venv/bin/python benchmarks/teardown_stall.py --runs 5,40 --rounds 2

Prints one line per case and round: how long the iterator ran, the batches it read (the rule must not
read fewer), and how long deleting it took. Measured (TF 2.21, 2 cores, 8 replicas, 12-15 s runs): as
TensorFlow builds it, 14 of 15 deletions waited 5.8-126 s; with the rule, 10 of 11 took 0.3 s.
"""
from __future__ import annotations

import argparse
import gc
import time

import tensorflow as tf

from tpu_pipeline.pipeline.runtime.device_buffers import untune_device_buffers


def pipeline(autotune: bool) -> tf.data.Dataset:
    dataset = tf.data.Dataset.range(10**12).map(lambda x: tf.cast(x, tf.float32) * 2,
                                                num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.batch(64).prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.autotune.enabled = autotune
    return dataset.with_options(options)


def seconds_to_delete(strategy: tf.distribute.Strategy | None, autotune: bool, run: float) -> tuple[int, float]:
    """(batches read in `run` seconds, seconds the deletion of the iterator blocked)."""
    dataset = pipeline(autotune)
    iterator = iter(strategy.experimental_distribute_dataset(dataset) if strategy else dataset)
    start, batches = time.monotonic(), 0
    while time.monotonic() - start < run:
        next(iterator)
        batches += 1
    start = time.monotonic()
    del iterator
    gc.collect()
    return batches, time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="12", help="seconds each iterator runs before it is deleted")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=8)
    args = parser.parse_args()
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)])
    for round_ in range(args.rounds):
        for run in (float(value) for value in args.runs.split(",")):
            for name, chosen, rule in (("plain iterator", None, True),
                                       (f"{args.replicas} replicas, as TensorFlow builds them", strategy, False),
                                       (f"{args.replicas} replicas, device_buffers rule", strategy, True)):
                untune_device_buffers(enabled=rule)
                batches, blocked = seconds_to_delete(chosen, True, run)
                print(f"round {round_} {name:<40} ran {run:4.0f} s ({batches:>6,} batches): "
                      f"deleting it took {blocked:6.2f} s", flush=True)
    untune_device_buffers()


if __name__ == "__main__":
    main()
