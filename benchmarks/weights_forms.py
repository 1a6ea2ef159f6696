"""Loss weights in each form, against none, in one packed LM pipeline (issue 50, item 7: packing with weights at
0.9x or more of the unweighted tokens/s).

    .venv/bin/python benchmarks/weights_forms.py --workload long --rounds 3

  plain    LM pack on the tokens alone
  inside   `weighted_tokens`, each token 2 * id + weight (what `convert --from chat` writes): one list parsed,
           lm_shift key weighted_tokens, the targets carried with their weights inside to the rows
  dense    a `loss_weights` int64 list beside the tokens (the two-key form: sets written before, users' own)
  default  no weights parsed: `lm_shift`'s `default_weight: 1` makes them, so only their carry costs
  spans    `loss_spans` ([start, end) pairs, a few integers a record) expanded per parsed block by a prototype
           op registered here (`span_weights_experiment`: unsorted_segment_sum of +-1 at the bounds, then
           tf.cumsum), then carried as `dense` is; an experiment, not a shipped path

Prints each form's median tokens/s over the rounds (forms alternating in one process), its ratio to plain and its
CPU µs per example, after checking that every weighted form gives `dense`'s first batch. The files are written
once, beside the workload's own (benchmarks/sequence_workloads.py: the weights are 0 on each document's first
half).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.path.dirname(os.path.abspath(__file__))]

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import bench_sequences as bench  # noqa: E402
import sequence_workloads  # noqa: E402
from tpu_pipeline.config import config_from_dict  # noqa: E402
from tpu_pipeline.format import read_metadata, write_metadata  # noqa: E402
from tpu_pipeline.ops.registry import register_op  # noqa: E402
from tpu_pipeline.pipeline import Pipeline  # noqa: E402
from tpu_pipeline.records.writer import write_split  # noqa: E402

WORKLOADS = {"long": ("seq_long", 1024), "docs": ("seq_docs", 256)}
SPANS = "loss_spans"


@register_op("span_weights_experiment", batchable=True)
def span_weights_experiment(key: str = "tokens", spans_key: str = SPANS, out_key: str = "loss_weights"):
    """`out_key`: 1 inside the record's [start, end) pairs of `spans_key`, 0 elsewhere, one per token of `key`."""
    def apply(features, seed=None):
        tokens, spans = features[key], features[spans_key]
        out = {k: v for k, v in features.items() if k != spans_key}
        if isinstance(tokens, tf.RaggedTensor):
            at = tf.gather(tokens.row_splits[:-1], spans.value_rowids()) + spans.flat_values
            size = tf.shape(tokens.flat_values, out_type=tf.int64)[0]
        else:
            at, size = spans, tf.size(tokens, tf.int64)
        sign = 1 - 2 * (tf.range(tf.size(at, tf.int64)) % 2)  # +1 at a start, -1 at an end
        weights = tf.cumsum(tf.math.unsorted_segment_sum(sign, at, size + 1)[:-1])
        out[out_key] = (tf.RaggedTensor.from_row_splits(weights, tokens.row_splits, validate=False)
                        if isinstance(tokens, tf.RaggedTensor) else weights)
        return out
    return apply


def spans_files(name: str) -> str:
    """The workload's tokens with `loss_spans` [len // 2, len]: the dense weights' ones, as spans."""
    folder = os.path.join(os.path.dirname(sequence_workloads.ensure(name)["dir"]), name + "_spans")
    if read_metadata(folder) is None:
        def records():
            for tokens in sequence_workloads.token_rows(name):
                feature = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens.tolist())),
                           SPANS: tf.train.Feature(int64_list=tf.train.Int64List(value=[len(tokens) // 2,
                                                                                         len(tokens)]))}
                yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
        split = write_split(records(), folder, "train", sequence_workloads.SHARDS)
        write_metadata(folder, {"name": name + "_spans", "source": "benchmarks/weights_forms.py",
                                "features": {}, "splits": {"train": split}})
    return os.path.join(folder, "train-*.tfrecord")


def lm_pack(pattern: str, length: int, form: str) -> tf.data.Dataset:
    features = {"tokens": {"dtype": "int64", "kind": "ragged"}}
    keys = ["inputs", "targets"]
    preprocess: list[dict] = [{"op": "lm_shift", "key": "tokens"}]
    if form != "plain":
        keys.append("loss_weights")
    if form == "dense":
        features["loss_weights"] = {"dtype": "int64", "kind": "ragged"}
    elif form == "default":
        preprocess = [{"op": "lm_shift", "key": "tokens", "default_weight": 1}]
    elif form == "spans":
        features[SPANS] = {"dtype": "int64", "kind": "ragged"}
        preprocess = [{"op": "span_weights_experiment"}] + preprocess
    elif form == "inside":
        features = {"weighted_tokens": {"dtype": "int64", "kind": "ragged"}}
        preprocess = [{"op": "lm_shift", "key": "weighted_tokens"}]
    data = {"source": {"type": "tfrecord", "files": pattern}, "features": features, "preprocess": preprocess,
            "sequence": {"keys": keys, "length": length, "mode": "pack", "overflow": "truncate"},
            "batch_size": bench.BATCH, "repeat": "forever", "shuffle": {"enabled": False}}
    config = config_from_dict({"data": data, "train": {"task": "language_model"},
                               "model": {"architecture": "transformer"}})
    return Pipeline.from_config(config.data).build()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="long")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    name, length = WORKLOADS[args.workload]
    plain = os.path.join(sequence_workloads.ensure(name)["dir"], "train-*.tfrecord")
    dense = os.path.join(sequence_workloads.ensure(name, weights="dense")["dir"], "train-*.tfrecord")
    inside = os.path.join(sequence_workloads.ensure(name, weights="inside")["dir"], "train-*.tfrecord")
    forms = {"plain": plain, "inside": inside, "dense": dense, "default": plain, "spans": spans_files(name)}
    first = [tf.nest.flatten(next(iter(lm_pack(forms[form], length, form)))) for form in ("dense", "spans", "inside")]
    for other in first[1:]:
        for mine, theirs in zip(first[0], other):
            assert np.array_equal(mine.numpy(), theirs.numpy()), "a form's first batch differs from dense's"
    runs: dict[str, list[dict]] = {form: [] for form in forms}
    for _ in range(args.rounds):
        for form, pattern in forms.items():
            runs[form].append(bench.measure(lambda: lm_pack(pattern, length, form), bench.count_lm, 1.0, 2.5))
    base = statistics.median(found["tok_s"] for found in runs["plain"])
    for form, found in runs.items():
        rate = statistics.median(r["tok_s"] for r in found)
        cpu = statistics.median(r["cpu_us_ex"] for r in found)
        print(f"{args.workload} {form:8s} {rate / 1e6:6.2f} M tokens/s, ÷ plain {rate / base:.3f}, CPU µs per "
              f"example {cpu:.1f}")


if __name__ == "__main__":
    main()
