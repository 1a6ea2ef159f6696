"""Distinct documents per batch of packed rows, rows shuffled after packing or not, on long documents.

    .venv/bin/python benchmarks/bench_row_shuffle.py                   # stdlib_docs, 200 batches of 16 x 256
    .venv/bin/python benchmarks/bench_row_shuffle.py --batches 400 --length 1024

The corpus (benchmarks/long_documents.py): the standard library's .py files, one document per file
(~670 files, median ~10 KB), converted by `tpu-pipeline convert --from text`. The pipeline is
`configs/text_lm.yaml`'s data section pointed at it (lm_shift, pack with overflow split, shuffle
buffer 4096 records), built by `Pipeline.from_config`, once with `data.sequence.row_shuffle=false`
(rows leave in packing order: what the package did before) and once with the default (auto).

Each segment of a row is traced back to its document by the hash of its tokens against every chunk
of every document (a chunk c of document d is inputs[c × length : (c + 1) × length]). Printed per
variant: distinct documents per batch (median, mean, lowest), the most rows one document fills in a
batch, and rows per second over the same batches (the shuffle's cost), side by side.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tpu_pipeline as tp  # noqa: E402
from long_documents import REPO, corpus  # noqa: E402


def chunk_index(directory: str, length: int) -> dict[bytes, int]:
    """{hash of a chunk's input tokens: its document} over every document of the split."""
    files = sorted(tf.io.gfile.glob(os.path.join(directory, "train-*")))
    spec = {"tokens": tf.io.RaggedFeature(tf.int64)}
    index: dict[bytes, int] = {}
    for number, record in enumerate(tf.data.TFRecordDataset(files)):
        inputs = tf.io.parse_single_example(record, spec)["tokens"].numpy()[:-1]
        for start in range(0, len(inputs), length):
            index[_digest(inputs[start:start + length])] = number
    return index


def _digest(tokens: np.ndarray) -> bytes:
    return hashlib.blake2b(np.asarray(tokens, np.int64).tobytes(), digest_size=12).digest()


def documents_per_batch(batch: dict, index: dict[bytes, int]) -> tuple[int, int]:
    """(distinct documents in the batch, most rows one document has in it)."""
    tokens, segments = batch["inputs"], batch["inputs_segment_ids"]
    rows_of: dict[int, set] = {}
    for row in range(tokens.shape[0]):
        for segment in set(segments[row][segments[row] > 0].tolist()):
            document = index[_digest(tokens[row][segments[row] == segment])]
            rows_of.setdefault(document, set()).add(row)
    return len(rows_of), max(len(rows) for rows in rows_of.values())


def run(directory: str, row_shuffle, batches: int, length: int, index: dict[bytes, int]) -> dict:
    overrides = [f"data.source.dir={directory}", f"data.sequence.length={length}",
                 f"data.sequence.row_shuffle={row_shuffle}"]
    config = tp.load_config(os.path.join(REPO, "configs", "text_lm.yaml"), overrides)
    pipeline = tp.Pipeline.from_config(config.data.model_copy(update={"outputs": None}))  # the features, by name
    iterator = iter(pipeline.build())
    next(iterator)  # past the first pool and the packer's compile
    started = time.perf_counter()
    taken = [{key: value.numpy() for key, value in next(iterator).items()} for _ in range(batches)]
    seconds = time.perf_counter() - started
    counts = [documents_per_batch(batch, index) for batch in taken]
    distinct = [c for c, _ in counts]
    return {"plan": pipeline.plan.sequence.reason, "median": statistics.median(distinct),
            "mean": statistics.fmean(distinct), "lowest": min(distinct), "most_rows": max(m for _, m in counts),
            "rows_per_sec": batches * taken[0]["inputs"].shape[0] / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--length", type=int, default=256)
    args = parser.parse_args()
    directory = corpus("stdlib_docs")
    index = chunk_index(directory, args.length)
    print(f"corpus: {directory} ({len(set(index.values()))} documents), rows of {args.length}, "
          f"{args.batches} batches of 16 rows after the first")
    results = {name: run(directory, value, args.batches, args.length, index)
               for name, value in (("rows in packing order", "false"), ("rows shuffled (auto)", "auto"))}
    print(f"{'':24s} {'distinct documents / batch: median':>36s} {'mean':>6s} {'lowest':>7s} "
          f"{'most rows of one doc':>21s} {'rows/s':>9s}")
    for name, r in results.items():
        print(f"{name:24s} {r['median']:36.1f} {r['mean']:6.1f} {r['lowest']:7d} {r['most_rows']:21d} "
              f"{r['rows_per_sec']:9,.0f}")
    for name, r in results.items():
        print(f"  {name}: {r['plan']}")
    base, shuffled = results.values()
    print(f"shuffled / in order: distinct documents per batch x{shuffled['mean'] / base['mean']:.1f}, "
          f"rows/s x{shuffled['rows_per_sec'] / base['rows_per_sec']:.2f}")


if __name__ == "__main__":
    main()
