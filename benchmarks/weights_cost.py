"""What per-token loss weights cost a packed language-model pipeline, and where (issue 50, item 7).

    .venv/bin/python benchmarks/weights_cost.py --tree . --workload long --rounds 3   # LM pack, without and with
    .venv/bin/python benchmarks/weights_cost.py --parse --workload long               # the parse alone

The first prints, for the checkout at --tree (run it for two trees in turn to compare commits), the median CPU µs
per example and tokens/s of bench_sequences' "LM pack" and "LM pack, weights" pipelines, alternating in one
process. `--parse` times one single-threaded pass of a batched `parse_example` (blocks of 4096 records) over the
workload's files: the tokens of the plain files, the tokens of the files with a `loss_weights` list beside them
(the two-key form), and both features of those; the difference of the last two is what parsing the weights as a
list of their own costs before any stage of ours runs (the form `convert --from chat` wrote before
`weighted_tokens`). "LM pack, weights" reads the weights inside the tokens, as convert writes them now.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
WORKLOADS = {"docs": ("seq_docs", 256), "text": ("seq_text", 1024), "long": ("seq_long", 1024)}


def pipelines(tree: str, workload: str, rounds: int) -> dict:
    sys.path[:0] = [os.path.abspath(tree), os.path.join(os.path.abspath(tree), "benchmarks")]
    import bench_sequences as bench
    import sequence_workloads

    name, length = WORKLOADS[workload]
    plain = os.path.join(sequence_workloads.ensure(name)["dir"], "train-*.tfrecord")
    weighted = os.path.join(sequence_workloads.ensure(name, weights=True)["dir"], "train-*.tfrecord")
    runs: dict[str, list[dict]] = {"LM pack": [], "LM pack, weights": []}
    for _ in range(rounds):
        runs["LM pack"].append(bench.measure(lambda: bench.lm_pack(plain, length, False), bench.count_lm, 1.0, 2.5))
        runs["LM pack, weights"].append(bench.measure(lambda: bench.lm_pack(weighted, length, True), bench.count_lm,
                                                      1.0, 2.5))
    return {"tree": tree, **{key: {"cpu_us_ex": statistics.median(r["cpu_us_ex"] for r in found),
                                   "mtok_s": statistics.median(r["tok_s"] for r in found) / 1e6}
                             for key, found in runs.items()}}


def parse_pass(workload: str, rounds: int) -> dict:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sequence_workloads
    import tensorflow as tf

    name, _ = WORKLOADS[workload]
    plain = sorted(tf.io.gfile.glob(os.path.join(sequence_workloads.ensure(name)["dir"], "train-*.tfrecord")))
    weighted = sorted(tf.io.gfile.glob(os.path.join(sequence_workloads.ensure(name, weights="dense")["dir"],
                                                    "train-*.tfrecord")))
    ragged = tf.io.RaggedFeature(tf.int64)
    cases = {"plain files, tokens": (plain, {"tokens": ragged}),
             "weighted files, tokens": (weighted, {"tokens": ragged}),
             "weighted files, tokens and weights": (weighted, {"tokens": ragged, "loss_weights": ragged})}
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.autotune.enabled = False
    seconds: dict[str, list[float]] = {case: [] for case in cases}
    examples = 0
    for _ in range(rounds):
        for case, (files, features) in cases.items():
            dataset = tf.data.TFRecordDataset(files).batch(4096).map(
                lambda records, f=features: tf.io.parse_example(records, f)).with_options(options)
            start, examples = time.process_time(), 0
            for block in dataset:
                examples += int(block["tokens"].nrows())
            seconds[case].append(time.process_time() - start)
    return {case: round(statistics.median(found) / examples * 1e6, 2) for case, found in seconds.items()} | {
        "unit": "CPU µs per example", "examples": examples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", default=".", help="the checkout whose pipelines to time")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="long")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parse", action="store_true", help="time the batched parse alone")
    args = parser.parse_args()
    print(json.dumps(parse_pass(args.workload, args.rounds) if args.parse else
                     pipelines(args.tree, args.workload, args.rounds)))


if __name__ == "__main__":
    main()
