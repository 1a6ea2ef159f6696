"""Sequence packing: our Packer stage against seqio's trim_and_pack_dataset, side by side.

    .venv/bin/python benchmarks/bench_packing.py [--rounds 3 --seconds 1.0 --workloads long,short]
    PYTHONPATH=/tmp/aa97487 .venv/bin/python benchmarks/bench_packing.py --alone --windows 1024   # another commit's packer

Workloads (pre-generated int32 token ids held in memory, `from_tensor_slices` of a RaggedTensor,
so only packing is measured):
  long   lognormal lengths, median 300 tokens, sigma 1 (long tail, ~5% over 1024), rows of 1024
  short  lognormal lengths, median 12 tokens, sigma 0.6 ("sentences"), rows of 128

Variants: Packer (first_fit_decreasing / best_fit_decreasing / first_fit, windows 64, 256, 1024;
ragged_batch → map(pack_window) → unbatch); at the largest window also with flat_map or rebatch
instead of unbatch, and `Packer(window=None)` on ragged batches already in memory (no per-example
element); seqio.utils.trim_and_pack_dataset (next fit, one open row); for reference, the source
alone (ragged_batch of the same examples, no packing), parsing the same examples from serialized
tf.Example (`tf.io.parse_example` with a RaggedFeature, batched and one by one), and batched parse
followed by `Packer(window=None)`. All consumers take batches of 64 rows (or the parsed batches).
A last table times `pack_window` alone (windows in memory, no tf.data): the algorithm's own cost.

Each round runs every variant once, in a rotated order, for about --seconds (whole passes over
the examples); ratios against seqio are taken within a round and reported as medians over rounds.
Printed per variant: rows, non-padding fraction of the rows, non-padding tokens per second,
wall µs and CPU µs (all threads of this process) per example, and tokens/s relative to seqio.
Absolute rates mean little on a shared 2-core machine: read the ratios and the CPU µs.

seqio (`pip install --no-deps seqio`, its wheel only) is imported without running its package
__init__ (which imports its evaluation, vocabularies and sentencepiece/tensorflow_text): two
modules are stubbed in sys.modules, `seqio` (an empty package pointing at the installed
directory) and `seqio.vocabularies` (a placeholder `Vocabulary` class, used only in a type
annotation of seqio.utils). seqio.utils itself and tensorflow_datasets are imported for real.
seqio counts non-zero tokens as an example's length, so it gets the same ids shifted by +1.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import statistics
import sys
import time
import types
from typing import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import tensorflow as tf  # noqa: E402

from tpu_pipeline.pipeline.sequences.packing import ALGORITHMS, Packer, pack_window  # noqa: E402
from tpu_pipeline.pipeline.stages.base import StageContext  # noqa: E402

WORKLOADS = {  # name: (median tokens, lognormal sigma, row length, examples per pass)
    "long": (300, 1.0, 1024, 4096),
    "short": (12, 0.6, 128, 32768),
}
KEY = "targets"
VOCAB = 32_000
CONSUMER_BATCH = 64
AUTO = tf.data.AUTOTUNE
ALGORITHM_NAMES = {"first_fit_decreasing": "ffd", "best_fit_decreasing": "bfd", "first_fit": "ff"}


def import_seqio_utils():
    """seqio.utils without seqio/__init__.py (see the module docstring for exactly what is stubbed)."""
    spec = importlib.util.find_spec("seqio")
    if spec is None:
        return None
    package = types.ModuleType("seqio")
    package.__path__ = list(spec.submodule_search_locations)
    vocabularies = types.ModuleType("seqio.vocabularies")
    vocabularies.Vocabulary = type("Vocabulary", (), {})
    sys.modules.setdefault("seqio", package)
    sys.modules.setdefault("seqio.vocabularies", vocabularies)
    import seqio.utils  # noqa: E402

    return seqio.utils


def make_examples(median: int, sigma: float, count: int, seed: int = 0) -> tf.RaggedTensor:
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(math.log(median), sigma, count).astype(np.int64))
    ids = rng.integers(0, VOCAB, int(lengths.sum())).astype(np.int32)
    return tf.RaggedTensor.from_row_lengths(ids, lengths)


def serialized(examples: tf.RaggedTensor) -> tf.Tensor:
    records = []
    for row in examples.to_list():
        feature = tf.train.Feature(int64_list=tf.train.Int64List(value=row))
        records.append(tf.train.Example(features=tf.train.Features(feature={KEY: feature})).SerializeToString())
    return tf.constant(records)


@tf.function
def consume(iterator) -> tuple[tf.Tensor, tf.Tensor]:
    """Pull every batch of packed rows; count rows and non-padding tokens (segment id > 0)."""
    rows = tf.constant(0, tf.int64)
    tokens = tf.constant(0, tf.int64)
    for batch in iterator:
        segments = batch[f"{KEY}_segment_ids"]
        rows += tf.cast(tf.shape(segments)[0], tf.int64)
        tokens += tf.math.count_nonzero(segments, dtype=tf.int64)
    return rows, tokens


@tf.function
def consume_parsed(iterator) -> tf.Tensor:
    tokens = tf.constant(0, tf.int64)
    for batch in iterator:
        tokens += tf.cast(tf.size(batch[KEY].flat_values), tf.int64)
    return tokens


def run_pass(build: Callable[[], tf.data.Dataset], parsed: bool) -> dict:
    process = psutil.Process()
    cpu = sum(process.cpu_times()[:2])
    start = time.perf_counter()
    dataset = build()
    if parsed:
        rows, tokens = 0, int(consume_parsed(iter(dataset)))
    else:
        rows, tokens = (int(v) for v in consume(iter(dataset)))
    return {"seconds": time.perf_counter() - start, "cpu": sum(process.cpu_times()[:2]) - cpu,
            "rows": rows, "tokens": tokens}


def windows_of(examples: tf.RaggedTensor, window: int) -> tf.data.Dataset:
    """The examples as ragged batches of `window` (the last one partial), straight from memory."""
    count = int(examples.nrows())
    starts = list(range(0, count, window))
    batched = tf.RaggedTensor.from_row_lengths(examples, [min(window, count - s) for s in starts])
    return tf.data.Dataset.from_tensor_slices({KEY: batched})


def variants(examples: tf.RaggedTensor, length: int, windows: list[int], seqio_utils) -> dict:
    """name -> (build, parsed?): each build makes one pass over all examples."""
    source = tf.data.Dataset.from_tensor_slices({KEY: examples})
    context = tf.distribute.InputContext()
    big = max(windows)
    out = {}
    if seqio_utils is not None:
        shifted = tf.data.Dataset.from_tensor_slices({KEY: examples.with_flat_values(examples.flat_values + 1)})
        out["seqio trim_and_pack"] = (
            lambda: seqio_utils.trim_and_pack_dataset(shifted, {KEY: length}).batch(CONSUMER_BATCH), False)
    for algorithm in ALGORITHMS:
        for window in windows:
            stage = Packer({KEY: length}, window=window, algorithm=algorithm)
            out[f"pack {ALGORITHM_NAMES[algorithm]} w={window}"] = (
                lambda stage=stage: stage.apply(source, StageContext(context)).batch(CONSUMER_BATCH), False)
    stage = Packer({KEY: length}, window=big)
    out[f"pack ffd w={big} flat_map"] = (lambda: source.ragged_batch(big).map(stage.pack, num_parallel_calls=AUTO)
                                         .flat_map(tf.data.Dataset.from_tensor_slices).batch(CONSUMER_BATCH), False)
    out[f"pack ffd w={big} rebatch"] = (lambda: source.ragged_batch(big).map(stage.pack, num_parallel_calls=AUTO)
                                        .rebatch(CONSUMER_BATCH), False)
    batches = Packer({KEY: length}, window=None)
    out[f"pack ffd batches of {big}"] = (lambda: batches.apply(windows_of(examples, big)).batch(CONSUMER_BATCH), False)
    out[f"ref: source ragged_batch({big})"] = (lambda: source.ragged_batch(big), True)
    records = tf.data.Dataset.from_tensor_slices(serialized(examples))
    features = {KEY: tf.io.RaggedFeature(tf.int64)}
    parse = lambda r: tf.io.parse_example(r, features)  # noqa: E731
    out[f"ref: parse_example batched {big}"] = (lambda: records.batch(big).map(parse, num_parallel_calls=AUTO), True)
    out["ref: parse_example one by one"] = (
        lambda: records.map(lambda r: parse(r[None]), num_parallel_calls=AUTO).batch(CONSUMER_BATCH), True)
    out[f"parse batched {big} + pack ffd"] = (
        lambda: batches.apply(records.batch(big).map(parse, num_parallel_calls=AUTO)).batch(CONSUMER_BATCH), False)
    return out


def pack_alone(examples: tf.RaggedTensor, length: int, windows: list[int], seconds: float) -> None:
    """pack_window itself on windows already in memory (no tf.data): the algorithm's own cost."""
    print("pack_window alone, in a tf.function, per example (µs, wall; median of 3):")
    print(f"{'window':>8s} " + " ".join(f"{ALGORITHM_NAMES[a]:>8s}" for a in ALGORITHMS) + f" {'(XLA off, ffd)':>15s}")
    for window in windows:
        batch = examples[:window]
        cells = []
        for algorithm, jit in [(a, True) for a in ALGORITHMS] + [("first_fit_decreasing", False)]:
            fn = tf.function(lambda w, a=algorithm, j=jit: pack_window({KEY: w}, {KEY: length}, a, jit_compile=j))
            fn(batch)
            start = time.perf_counter()
            fn(batch)
            calls = max(3, int(seconds / max(time.perf_counter() - start, 1e-4) / 3))
            timings = []
            for _ in range(3):
                start = time.perf_counter()
                for _ in range(calls):
                    fn(batch)
                timings.append((time.perf_counter() - start) / calls / window * 1e6)
            cells.append(statistics.median(timings))
        print(f"{window:8d} " + " ".join(f"{c:8.2f}" for c in cells[:-1]) + f" {cells[-1]:15.2f}", flush=True)


def bench_workload(name: str, rounds: int, seconds: float, windows: list[int], seqio_utils,
                   alone: bool = False) -> None:
    median, sigma, length, count = WORKLOADS[name]
    examples = make_examples(median, sigma, count)
    if alone:
        print(f"\n== {name}: rows of {length} ==", flush=True)
        pack_alone(examples, length, windows, seconds)
        return
    lengths = examples.row_lengths().numpy()
    kept = np.minimum(lengths, length)
    print(f"\n== {name}: {count} examples, lognormal median {median} sigma {sigma}, mean {lengths.mean():.0f}, "
          f"{(lengths > length).mean():.1%} over {length}; rows of {length}; lower bound "
          f"{math.ceil(kept.sum() / length)} rows ==", flush=True)
    table = variants(examples, length, windows, seqio_utils)
    names = list(table)
    passes = {}
    for variant in names:  # warm up (traces, XLA compiles) and size each measurement to ~seconds
        build, parsed = table[variant]
        first = run_pass(build, parsed)
        passes[variant] = max(1, round(seconds / max(first["seconds"], 1e-3)))
    results: dict[str, list[dict]] = {v: [] for v in names}
    for index in range(rounds):
        for variant in names[index % len(names):] + names[:index % len(names)]:
            build, parsed = table[variant]
            k = passes[variant]
            results[variant].append(run_pass(lambda: build().repeat(k), parsed) | {"examples": count * k, "passes": k})
    base = "seqio trim_and_pack" if "seqio trim_and_pack" in results else None
    print(f"{'variant':32s} {'rows':>6s} {'non-pad':>8s} {'Mtok/s':>7s} {'wall µs/ex':>10s} {'CPU µs/ex':>9s}"
          f" {'x seqio':>8s}")
    for variant in names:
        runs = results[variant]
        rate = [r["tokens"] / r["seconds"] for r in runs]
        wall = statistics.median(r["seconds"] / r["examples"] for r in runs) * 1e6
        cpu = statistics.median(r["cpu"] / r["examples"] for r in runs) * 1e6
        rows = runs[0]["rows"] // runs[0]["passes"]
        fill = f"{runs[0]['tokens'] / (runs[0]['rows'] * length):.1%}" if rows else "-"
        ratio = "-"
        if base and not variant.startswith("ref:"):
            ratio = f"{statistics.median(r / (b['tokens'] / b['seconds']) for r, b in zip(rate, results[base])):.2f}"
        print(f"{variant:32s} {rows if rows else '-':>6} {fill:>8s} {statistics.median(rate) / 1e6:7.2f} {wall:10.1f}"
              f" {cpu:9.1f} {ratio:>8s}", flush=True)
    pack_alone(examples, length, windows, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0, help="about how long one measurement runs")
    parser.add_argument("--workloads", default="long,short")
    parser.add_argument("--windows", default="64,256,1024")
    parser.add_argument("--alone", action="store_true", help="only the last table: pack_window alone, XLA on and off "
                        "(PYTHONPATH=<a worktree> times another commit's)")
    args = parser.parse_args()
    seqio_utils = import_seqio_utils()
    if seqio_utils is None:
        print(f"seqio is not installed ({sys.executable} -m pip install --no-deps seqio): no seqio column")
    windows = [int(w) for w in args.windows.split(",")]
    print(f"TF {tf.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for name in args.workloads.split(","):
        bench_workload(name, args.rounds, args.seconds, windows, seqio_utils, args.alone)


if __name__ == "__main__":
    main()
