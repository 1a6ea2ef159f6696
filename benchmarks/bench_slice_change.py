"""What a resume on another number of hosts costs a packed stream: the dealt rows' rate beside the host's own.

After a slice change each new host packs every old host's rest of the epoch and keeps 1/M of it (docs/resume.md,
"On another slice"); from epoch E + 1 on it reads its own shard at its usual rate. This times, side by side in one
process and round, new host 0 reading its share of the dealt rows and the same host reading its own stream (rows a
second and the process's CPU a row of each, and their ratios), for 2 -> 1, 1 -> 2 and 4 -> 2 hosts; and the seconds the resume took to find E
(each old host's current pool packed once).

    python benchmarks/bench_slice_change.py --workload seq_long --length 1024 --rounds 3

The old hosts stop after --steps steps of their stream; the timed batches are all inside the dealt rows (checked).
Absolute rates drift on a shared machine: read the ratios.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tensorflow as tf  # noqa: E402

import sequence_workloads  # noqa: E402
from tpu_pipeline.config import config_from_dict  # noqa: E402
from tpu_pipeline.pipeline import Pipeline  # noqa: E402
from tpu_pipeline.pipeline.core.resume_position import last_position  # noqa: E402
from tpu_pipeline.pipeline.core.row_remainder import IN_REST  # noqa: E402
from tpu_pipeline.train import packed_slice  # noqa: E402

REPLICAS = 4
CHANGES = ((2, 1), (1, 2), (4, 2))


def packed(files: str, length: int, batch: int) -> Pipeline:
    data = {"source": {"type": "tfrecord", "files": files},
            "features": {"tokens": {"dtype": "int64", "kind": "ragged"}},
            "sequence": {"keys": ["tokens"], "length": length, "mode": "pack"},
            "batch_size": batch, "repeat": "forever", "seed": 1, "shuffle": {"buffer_size": 1024}}
    return Pipeline.from_config(config_from_dict({"data": data}).data)


def places(pipeline: Pipeline, hosts: int, steps: int) -> tuple[tuple[int, int, int], ...]:
    """Each of `hosts` old hosts' place after `steps` steps (a batch a replica each step)."""
    out = []
    for index in range(hosts):
        stream = pipeline.build(tf.distribute.InputContext(hosts, index, REPLICAS), with_position=True)
        position = None
        for _, position in stream.take(steps * REPLICAS // hosts):
            pass
        example, chunk, row = (int(value) for value in last_position(position).numpy())
        out.append((example, chunk, row + 1))
    return tuple(out)


def rate(dataset: tf.data.Dataset, batches: int) -> tuple[float, float, int]:
    """(rows a second and the process's CPU µs a row over `batches` batches after the first, the last element's
    chunk field)."""
    iterator = iter(dataset)
    element = next(iterator)
    rows, start, cpu = 0, time.perf_counter(), time.process_time()
    for _ in range(batches):
        element = next(iterator)
        rows += int(tf.shape(element[0]["tokens"])[0])
    per_row = (time.process_time() - cpu) / rows * 1e6
    return rows / (time.perf_counter() - start), per_row, int(tf.reshape(element[1]["_chunk"], [-1])[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="seq_long", choices=sequence_workloads.NAMES)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64, help="global batch of rows")
    parser.add_argument("--steps", type=int, default=2, help="steps the old hosts ran")
    parser.add_argument("--batches", type=int, default=300, help="timed batches of each stream (several pools)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache_dir")
    args = parser.parse_args()
    pipeline = packed(sequence_workloads.files(args.workload, args.cache_dir), args.length, args.batch)
    ratios: dict[tuple[int, int], list[float]] = {change: [] for change in CHANGES}
    found: dict[tuple[int, int], list[float]] = {change: [] for change in CHANGES}
    cpu: dict[tuple[int, int], list[float]] = {change: [] for change in CHANGES}
    for round_number in range(args.rounds):
        for was, now in CHANGES:
            saved = places(pipeline, was, args.steps)
            start = time.perf_counter()
            remainder, dealt = packed_slice.deal(pipeline, saved, None, REPLICAS, now)
            found[(was, now)].append(time.perf_counter() - start)
            context = tf.distribute.InputContext(now, 0, REPLICAS)
            example, chunk, skip = dealt[0]
            own, own_cpu, _ = rate(pipeline.build(context, with_position=True), args.batches)
            share, share_cpu, last = rate(pipeline.build(context, start=example, chunk=chunk, skip=skip, remainder=remainder,
                                              with_position=True), args.batches)
            assert last == IN_REST, "the timed batches ran past the dealt rows: lower --batches or raise --steps"
            ratios[(was, now)].append(share / own)
            cpu[(was, now)].append(share_cpu / own_cpu)
            print(f"round {round_number + 1}: {was} -> {now} hosts: dealt rows {share:,.0f} rows/s ({share_cpu:,.0f} CPU "
                  f"µs a row), own stream {own:,.0f} rows/s ({own_cpu:,.0f}), ratio {share / own:.2f} (CPU a row "
                  f"{share_cpu / own_cpu:.2f}); E found in {found[(was, now)][-1]:.1f} s", flush=True)
    print(f"\n{args.workload}@{args.length}, global batch {args.batch} rows, {REPLICAS} replicas, "
          f"{args.rounds} round(s): new host 0's dealt rows / its own stream, rows a second (median, worst) and CPU "
          "a row (median, worst), E found in (median)")
    for change in CHANGES:
        print(f"  {change[0]} -> {change[1]} hosts: {statistics.median(ratios[change]):.2f} "
              f"({min(ratios[change]):.2f}), CPU {statistics.median(cpu[change]):.2f} ({max(cpu[change]):.2f}); "
              f"{statistics.median(found[change]):.1f} s")


if __name__ == "__main__":
    main()
