"""One packing pipeline measured in a process of its own: bench_sequences.py --against runs it.

    PYTHONPATH=/tmp/aa97487 .venv/bin/python benchmarks/pack_child.py --pipeline ours \
        --files "$CACHE/bench/seq_docs/train-*.tfrecord" --length 256 --batch 32 --seconds 3 --warmup 2

Prints one JSON line: real (non-padding) tokens, token slots, examples, seconds and CPU seconds of this
process (all its threads) over the timed batches, and the load average when it ended.

  ours   data.sequence mode pack (overflow truncate, every other key at its default: records and rows
         shuffled where the tree does), built by `Pipeline.from_config` of whatever `tpu_pipeline` this
         process imports: the tree named by PYTHONPATH (a worktree of another commit) or this one. Only
         `tpu_pipeline.config.config_from_dict` and `tpu_pipeline.pipeline.Pipeline` are used, which every
         commit since issue 20 has.
  seqio  seqio.utils.trim_and_pack_dataset (bench_sequences.py's `seqio pack`: its own code, from its wheel)

Real tokens are counted from segment ids (> 0), never by value: id 0 is a real token here.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

KEY = "tokens"


def ours(files: str, length: int, batch: int) -> tf.data.Dataset:
    from tpu_pipeline.config import config_from_dict
    from tpu_pipeline.pipeline import Pipeline

    data = {"source": {"type": "tfrecord", "files": files},
            "features": {KEY: {"dtype": "int64", "kind": "ragged"}},
            "sequence": {"keys": [KEY], "length": length, "mode": "pack", "overflow": "truncate"},
            "batch_size": batch, "repeat": "forever"}
    return Pipeline.from_config(config_from_dict({"data": data}).data).build()


def seqio(files: str, length: int, batch: int) -> tf.data.Dataset:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_sequences  # this tree's: the seqio baseline as the full table builds it

    utils = bench_sequences.import_seqio_utils()
    if utils is None:
        raise SystemExit(f"seqio is not installed: {sys.executable} -m pip install --no-deps seqio")
    return bench_sequences.seqio_pack(utils, files, length, batch)


@tf.function
def consume(iterator: tf.data.Iterator, batches: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    real = tf.constant(0, tf.int64)
    slots = tf.constant(0, tf.int64)
    examples = tf.constant(0, tf.int64)
    for _ in tf.range(batches):
        segments = next(iterator)[f"{KEY}_segment_ids"]
        real += tf.math.count_nonzero(segments, dtype=tf.int64)
        slots += tf.size(segments, tf.int64)
        examples += tf.cast(tf.reduce_sum(tf.reduce_max(segments, axis=1)), tf.int64)
    return real, slots, examples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", choices=("ours", "seqio"), required=True)
    parser.add_argument("--files", required=True)
    parser.add_argument("--length", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=3.0, help="timed, about")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds pulled after the first batch, untimed")
    args = parser.parse_args()
    build = ours if args.pipeline == "ours" else seqio
    iterator = iter(build(args.files, args.length, args.batch))
    consume(iterator, tf.constant(1, tf.int64))  # the first batch: tracing, the packer's XLA compile
    start, pulled = time.perf_counter(), 0
    while time.perf_counter() - start < args.warmup:
        consume(iterator, tf.constant(4, tf.int64))
        pulled += 4
    batches = max(8, int(pulled / max(time.perf_counter() - start, 1e-3) * args.seconds))
    cpu, start = time.process_time(), time.perf_counter()
    real, slots, examples = (int(value) for value in consume(iterator, tf.constant(batches, tf.int64)))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    import tpu_pipeline  # noqa: E402 (which tree this process measured)

    print(json.dumps({"pipeline": args.pipeline, "tree": os.path.dirname(os.path.dirname(tpu_pipeline.__file__)),
                      "tensorflow": tf.__version__, "batches": batches, "real": real, "slots": slots,
                      "examples": examples, "seconds": seconds, "cpu": cpu, "load": os.getloadavg()[0]}), flush=True)


if __name__ == "__main__":
    main()
