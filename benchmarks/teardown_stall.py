"""How long TensorFlow takes to delete a distributed iterator, by how long it ran (found for issue 46).

A `MirroredStrategy` iterator (a MultiDeviceIterator under it) whose pipeline is autotuned sometimes
blocks the thread that deletes it for about as long as it ran, up to ~60 s: the deletion waits for
tf.data's autotuning thread, whose sleep between optimizations doubles up to a minute. Measured here
(TF 2.21, 2 cores) after 40 s runs: 42.5 s, 42.1 s, 0.2 s and 1.2 s (three in fresh processes, one in
this script), so about half the time. A plain iterator of the same pipeline was deleted at once every
time, and so was the distributed one with `options.autotune.enabled=False`.
In a long test process the deletion happens wherever Python's garbage collector frees an old one
(`test_named_data_errors` waited 80 s in a full run, in the middle of tracing another model); in `train`,
at the end of a `fit` or an evaluation that ran that long.

    .venv/bin/python benchmarks/teardown_stall.py                  # 5 s and 40 s runs, autotune on and off

Prints one line per case: how long the iterator ran, and how long deleting it took.
"""
from __future__ import annotations

import argparse
import gc
import time

import tensorflow as tf


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
    parser.add_argument("--runs", default="5,40", help="seconds each iterator runs before it is deleted")
    parser.add_argument("--replicas", type=int, default=8)
    args = parser.parse_args()
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)])
    for run in (float(value) for value in args.runs.split(",")):
        for name, chosen, autotune in (("plain iterator, autotune on", None, True),
                                       (f"{args.replicas} replicas, autotune on", strategy, True),
                                       (f"{args.replicas} replicas, autotune off", strategy, False)):
            batches, blocked = seconds_to_delete(chosen, autotune, run)
            print(f"{name:<28} ran {run:4.0f} s ({batches:>6,} batches): deleting it took {blocked:5.2f} s", flush=True)


if __name__ == "__main__":
    main()
