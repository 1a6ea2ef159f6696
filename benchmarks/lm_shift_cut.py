"""What `lm_shift` costs on a parsed block, alone: the cut of a ragged batch into inputs and targets (and the
targets' weights), one thread, for the checkout at --tree.

    .venv/bin/python benchmarks/lm_shift_cut.py --tree /tmp/before --workload long   # then --tree . ; in turn

Prints the median CPU ms per block of `--block` examples of the workload (the first block of its files, parsed
once), without and with weights (the weights: each token's parity), and ns per token. Run it for two trees in
turn to compare commits; `benchmarks/weights_cost.py` times the whole packed pipeline around it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
WORKLOADS = {"docs": "seq_docs", "text": "seq_text", "long": "seq_long"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", default=".", help="the checkout whose lm_shift to time")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="long")
    parser.add_argument("--block", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    sys.path[:0] = [os.path.abspath(args.tree), os.path.join(os.path.abspath(args.tree), "benchmarks")]
    import sequence_workloads
    import tensorflow as tf

    from tpu_pipeline.ops.token_ops import lm_shift

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    files = sorted(tf.io.gfile.glob(os.path.join(sequence_workloads.ensure(WORKLOADS[args.workload])["dir"],
                                                 "train-*.tfrecord")))
    records = next(iter(tf.data.TFRecordDataset(files).batch(args.block)))
    tokens = tf.io.parse_example(records, {"tokens": tf.io.RaggedFeature(tf.int64)})["tokens"]
    weights = tf.ragged.map_flat_values(lambda values: values % 2, tokens)
    shift = lm_shift()
    cases = {"without weights": {"tokens": tokens}, "with weights": {"tokens": tokens, "loss_weights": weights}}
    out = {"tree": args.tree, "workload": args.workload, "examples": int(tokens.nrows()),
           "tokens": int(tf.size(tokens.flat_values))}
    for name, features in cases.items():
        run = tf.function(lambda f: {k: v.flat_values for k, v in shift(f).items()})
        run(features)
        seconds = []
        for _ in range(args.repeats):
            start = time.process_time()
            run(features)
            seconds.append(time.process_time() - start)
        median = statistics.median(seconds)
        out[name] = {"cpu_ms_block": round(median * 1e3, 3), "ns_token": round(median / out["tokens"] * 1e9, 2)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
