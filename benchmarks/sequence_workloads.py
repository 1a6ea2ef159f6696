"""The sequence benchmark's workloads: tf.Examples with one variable-length int64 `tokens` feature.

    .venv/bin/python benchmarks/sequence_workloads.py     # once (~10 s); bench_sequences.py also does it

  seq_long   32768 documents, lognormal lengths (median 300 tokens, sigma 1.0: mean ~500, ~11% over
             1024, ~3% over 2048), ids uniform in [0, 32000)
  seq_short  131072 sentences, lognormal lengths (median 12 tokens, sigma 0.6: mean ~14, max ~200), same ids
  seq_docs   3000 documents of 3-256 tokens (uniform), same ids: a short corpus whose documents all fit
             a row of 256 (issue 37's measurement; an epoch is ~0.4M tokens)
  seq_text   the CPython documentation that ships with every Python (`pydoc_data.topics`), split
             into paragraphs at blank lines, byte-tokenized as the tokenize_bytes op does (UTF-8
             bytes + 3); topics in sorted order, paragraphs in document order (2608 paragraphs,
             median 114 tokens, mean 177, 0.5% over 1024)

Token id 0 is a real token here (the synthetic ids include it). Each is written once, in 4 shards,
under $TPU_PIPELINE_CACHE/bench/<name> with metadata.json (its feature spec and length statistics);
generated data is never committed.
"""
from __future__ import annotations

import math
import os
import re
import sys
from typing import Iterator

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

from tpu_pipeline.format import read_metadata, write_metadata  # noqa: E402
from tpu_pipeline.ops.token_ops import BYTE_OFFSET  # noqa: E402
from tpu_pipeline.records.writer import write_split  # noqa: E402
from workloads import bench_dir  # noqa: E402

KEY = "tokens"
VOCAB = 32_000
SHARDS = 4
SYNTHETIC = {  # name: (examples, lognormal median, sigma)
    "seq_long": (32_768, 300, 1.0),
    "seq_short": (131_072, 12, 0.6),
}
UNIFORM = {"seq_docs": (3_000, 3, 256)}  # name: (examples, fewest tokens, most tokens)
NAMES = ("seq_long", "seq_short", "seq_text", "seq_docs")


def synthetic_lengths(name: str, seed: int = 0) -> tuple[np.random.Generator, np.ndarray]:
    rng = np.random.default_rng(seed)
    if name in UNIFORM:
        count, low, high = UNIFORM[name]
        return rng, rng.integers(low, high + 1, count, dtype=np.int64)
    count, median, sigma = SYNTHETIC[name]
    return rng, np.maximum(1, rng.lognormal(math.log(median), sigma, count).astype(np.int64))


def text_paragraphs() -> list[bytes]:
    """pydoc_data.topics split at blank lines, as UTF-8 bytes (empty paragraphs dropped)."""
    from pydoc_data.topics import topics

    paragraphs = []
    for name in sorted(topics):
        paragraphs += [p.strip("\n").encode("utf-8") for p in re.split(r"\n[ \t]*\n", topics[name]) if p.strip()]
    return paragraphs


def token_rows(name: str) -> Iterator[np.ndarray]:
    if name == "seq_text":
        for paragraph in text_paragraphs():
            yield np.frombuffer(paragraph, np.uint8).astype(np.int64) + BYTE_OFFSET
        return
    rng, lengths = synthetic_lengths(name)
    ids = rng.integers(0, VOCAB, int(lengths.sum()), dtype=np.int64)
    for start, length in zip(np.cumsum(lengths) - lengths, lengths):
        yield ids[start:start + length]


WEIGHTS = "loss_weights"
WEIGHTED = "weighted_tokens"
# weights= of `ensure`: none, inside the tokens (what `convert --from chat` writes), or a list beside them
FORMS = {False: "", "inside": "_weighted", "dense": "_weights"}


def serialize(tokens: np.ndarray, weights: str | bool = False) -> bytes:
    """A tf.Example of the tokens; with `weights`, weights 0 on the first half of the tokens (a prompt) and 1 on
    the rest (its answer): inside them, `weighted_tokens` (2 * id + weight, as `convert --from chat` writes), or
    "dense", a `loss_weights` list beside `tokens` (the two-key form)."""
    mask = (np.arange(len(tokens)) >= len(tokens) // 2).astype(np.int64)
    weights = "inside" if weights is True else weights
    if weights == "inside":
        feature = {WEIGHTED: tf.train.Feature(int64_list=tf.train.Int64List(value=(2 * tokens + mask).tolist()))}
    else:
        feature = {KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=tokens.tolist()))}
    if weights == "dense":
        feature[WEIGHTS] = tf.train.Feature(int64_list=tf.train.Int64List(value=mask.tolist()))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def ensure(name: str, cache_dir: str | None = None, weights: str | bool = False) -> dict:
    """The workload's metadata (its directory under "dir"), generated on first use; `weights` ("inside" or
    "dense", `serialize`): the same tokens with loss weights, in a directory of its own."""
    weights = "inside" if weights is True else weights
    if weights not in FORMS:
        raise ValueError(f"weights: one of {sorted(map(str, FORMS))}, got {weights!r}")
    out_dir = os.path.join(bench_dir(cache_dir), name + FORMS[weights])
    metadata = read_metadata(out_dir)
    if metadata is None:
        lengths: list[int] = []

        def records() -> Iterator[bytes]:
            for tokens in token_rows(name):
                lengths.append(len(tokens))
                yield serialize(tokens, weights)

        split = write_split(records(), out_dir, "train", SHARDS)
        array = np.array(lengths)
        stats = {"examples": len(lengths), "tokens": int(array.sum()), "median": float(np.median(array)),
                 "mean": float(array.mean()), "min": int(array.min()), "max": int(array.max()),
                 "kept": {str(n): int(np.minimum(array, n).sum()) for n in (128, 256, 512, 1024, 2048, 4096)},
                 "over": {str(n): float((array > n).mean()) for n in (128, 256, 512, 1024, 2048, 4096)}}
        features = {WEIGHTED if weights == "inside" else KEY: {"dtype": "int64", "kind": "ragged"}}
        if weights == "dense":
            features[WEIGHTS] = {"dtype": "int64", "kind": "ragged"}
        write_metadata(out_dir, {"name": name, "source": "benchmarks/sequence_workloads.py", "features": features,
                                 "splits": {"train": split}, "lengths": stats})
        metadata = read_metadata(out_dir)
    return {**metadata, "dir": out_dir}


def files(name: str, cache_dir: str | None = None) -> str:
    return os.path.join(ensure(name, cache_dir)["dir"], "train-*.tfrecord")


if __name__ == "__main__":
    for workload in NAMES:
        meta = ensure(workload)
        stats = meta["lengths"]
        size = sum(os.path.getsize(os.path.join(meta["dir"], f)) for f in os.listdir(meta["dir"]))
        print(f"{workload}: {meta['dir']} ({size / 2**20:.0f} MiB): {stats['examples']} examples, "
              f"{stats['tokens']} tokens, median {stats['median']:.0f}, mean {stats['mean']:.0f}, max {stats['max']}")
