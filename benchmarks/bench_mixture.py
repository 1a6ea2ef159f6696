"""A mixture of three sources against one source, and against tf.data's own mixer, side by side.

    .venv/bin/python benchmarks/bench_mixture.py --rounds 5 --seconds 2 --records 50000
    .venv/bin/python benchmarks/bench_mixture.py --workload text@1024 --shuffle off

The sequence benchmark's files (benchmarks/sequence_workloads.py: 4 shards of tf.Examples with one
`tokens` feature) are read as one source, or as three (shards 0-1, 2 and 3, weights 0.5/0.3/0.2),
packed into rows (data.sequence pack, truncate) and batched by 64, on one input pipeline:

  one source            data.source: all four shards (the plan's own choices: window shuffle, and
                        the record cache: from the second epoch on it reads no file)
  one source, no cache  the same with data.cache.records: false (every epoch read from the files;
                        a mixture's sources replay theirs from memory when the plan's record cache is on)
  ours mixture (3)      data.mixture of the three, our schedule (each source shuffles its own records),
                        each record's source beside it, added after the parse as `_source` and
                        counted per packed row
  ours, not carried     the same mixture, the sources dropped at the parse (pack and batch never see
                        them): what carrying and counting them costs
  ours, no cache        the mixture with data.cache.records: false (each source reads every epoch
                        from its files, and each block is laid out from the records read): compare
                        with one source, no cache
  sample_from_datasets  the same three sources, read and shuffled alike, mixed by tf.data's own
                        `tf.data.Dataset.sample_from_datasets(weights=..., seed=...)` instead of ours;
                        everything else (parse, pack, batch) the same pipeline

Throughput: non-padding tokens per second and per CPU-second, ratios within a round (median and
worst over rounds), to one source and to one source without its record cache. Shares: the first
--records records of each mixer's stream, by the source beside every record: the delivered
example shares, and the largest gap between a source's share and its weight over every prefix of
at least 1,000 records (ours is stratified: within a block's quota; tf.data draws each choice
independently).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
from typing import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sequence_workloads  # noqa: E402
from bench_sequences import BATCH, KEY, WORKLOADS, count_segments, measure  # noqa: E402
from tpu_pipeline.config import config_from_dict  # noqa: E402
from tpu_pipeline.pipeline import Pipeline  # noqa: E402
from tpu_pipeline.pipeline.core.element_keys import RECORDS_KEY, SOURCE_KEY  # noqa: E402
from tpu_pipeline.pipeline.core.mixed_records import mixed  # noqa: E402
from tpu_pipeline.pipeline.mixtures.mixture_source import MixtureSource, source_seed  # noqa: E402
from tpu_pipeline.pipeline.stages.parse import make_parser  # noqa: E402

WEIGHTS = (0.5, 0.3, 0.2)
GROUPS = ((0, 1), (2,), (3,))  # shards of each source


@dataclasses.dataclass(frozen=True)
class SampledMixture(MixtureSource):
    """Our mixture's sources (read and shuffled alike, each record with its source), mixed by tf.data's
    sample_from_datasets."""

    def build_from(self, context: tf.distribute.InputContext, delivered: int) -> tf.data.Dataset:
        assert delivered == 0, "sample_from_datasets resumes only by tf.data's own iterator checkpoint"
        streams = []
        for index, part in enumerate(self.parts):
            records = self._stream(index, part, context, 0, None).unbatch()  # tf.data's mixer takes single records
            streams.append(records.map(lambda record, index=index: mixed(record, index)))
        return tf.data.Dataset.sample_from_datasets(streams, weights=list(self.weights),
                                                    seed=source_seed(self.seed, "sample_from_datasets"))


def shard_files(directory: str, shards: tuple[int, ...]) -> list[str]:
    names = sorted(name for name in os.listdir(directory) if name.startswith("train-"))
    return [os.path.join(directory, names[index]) for index in shards]


def configs(directory: str, length: int, shuffle: bool) -> tuple[dict, dict, dict, dict]:
    common = {"features": {KEY: {"dtype": "int64", "kind": "ragged"}},
              "sequence": {"keys": [KEY], "length": length, "mode": "pack", "overflow": "truncate"},
              "batch_size": BATCH, "repeat": "forever",
              "shuffle": {"buffer_size": 4096} if shuffle else {"enabled": False}}
    one = {"data": {"source": {"type": "tfrecord", "files": shard_files(directory, (0, 1, 2, 3))}, **common}}
    uncached = {"data": {**one["data"], "cache": {"records": False}}}
    sources = [{"name": f"part{index}", "weight": weight, "source": {"type": "tfrecord", "files": shard_files(directory, group)}}
               for index, (weight, group) in enumerate(zip(WEIGHTS, GROUPS))]
    mixed = {"data": {"mixture": {"sources": sources}, **common}}
    return one, uncached, mixed, {"data": {**mixed["data"], "cache": {"records": False}}}


def with_parse(pipeline: Pipeline, parse: Callable) -> Pipeline:
    """`pipeline` with `parse` in place of the parse of its records."""
    stages = tuple(dataclasses.replace(stage, parse=parse) if getattr(stage, "parse", None) is not None else stage
                   for stage in pipeline.stages)
    return dataclasses.replace(pipeline, stages=stages)


def not_carried(pipeline: Pipeline) -> Pipeline:
    """The mixture with its sources dropped at the parse: the records parsed alone, no stage after carries them."""
    parse = make_parser(pipeline.plan.features.value, batched=pipeline.plan.parse.value == "batched")
    return with_parse(pipeline, lambda element: parse(element[RECORDS_KEY]))


def pipelines(one: dict, uncached: dict, mixed: dict, mixed_uncached: dict) -> tuple:
    mixed_config = config_from_dict(mixed).data
    ours = Pipeline.from_config(mixed_config)
    theirs = ours.with_source(SampledMixture(**{field.name: getattr(ours.source, field.name)
                                                for field in dataclasses.fields(MixtureSource)}))
    return {"one source": lambda: Pipeline.from_config(config_from_dict(one).data).build(),
            "one source, no cache": lambda: Pipeline.from_config(config_from_dict(uncached).data).build(),
            "ours mixture (3)": ours.build,
            "ours, not carried": not_carried(ours).build,
            "ours, no cache": lambda: Pipeline.from_config(config_from_dict(mixed_uncached).data).build(),
            "sample_from_datasets": theirs.build}, ours.source, theirs.source


def shares(source: MixtureSource, records: int) -> dict:
    """Delivered example shares of a mixer's first `records` records, and the worst prefix gap."""
    stream = source.build_from(tf.distribute.InputContext(), 0).map(lambda element: element[SOURCE_KEY])
    stream = stream.unbatch() if stream.element_spec.shape.rank == 1 else stream
    tags = np.concatenate([block.numpy() for block in stream.take(records).batch(8192)])
    counts = np.cumsum(np.eye(len(WEIGHTS), dtype=np.int64)[tags], axis=0)
    prefix = np.arange(1, len(tags) + 1)[:, None]
    gaps = np.abs(counts / prefix - np.asarray(WEIGHTS))[999:]
    return {"shares": (counts[-1] / len(tags)).tolist(), "worst_gap": float(gaps.max()),
            "worst_gap_examples": float((np.abs(counts - prefix * np.asarray(WEIGHTS))[999:]).max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="long@1024", choices=sorted(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--shuffle", choices=("on", "off"), default="on")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--cache_dir", default=None)
    args = parser.parse_args()
    name, length = WORKLOADS[args.workload]
    meta = sequence_workloads.ensure(name, args.cache_dir)
    table, ours, theirs = pipelines(*configs(meta["dir"], length, args.shuffle == "on"))
    names = list(table)
    print(f"== {args.workload}: {meta['lengths']['examples']} examples in 4 shards; sources {GROUPS} weights {WEIGHTS}; "
          f"pack to {length}, batches of {BATCH}; shuffle {args.shuffle} ==", flush=True)
    rounds = []
    for index in range(args.rounds):
        order = names[index % len(names):] + names[:index % len(names)]
        results = {pipeline: measure(table[pipeline], count_segments, args.warmup, args.seconds) for pipeline in order}
        rounds.append(results)
        # The load average beside each round: other jobs on a shared machine show there, not in the ratios' medians.
        print(f"  round {index + 1}: " + ", ".join(f"{n} {results[n]['tok_s'] / 1e6:.2f}" for n in names)
              + f" M non-padding tokens/s (load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)", flush=True)
    print(f"{'pipeline':22s} {'Mtok/s':>7s} {'Mtok/CPU-s':>10s} {'tok/s ÷ one':>14s} {'tok/CPU-s ÷ one':>16s} "
          f"{'tok/s ÷ no cache':>17s}")
    for pipeline in names:
        med = lambda field: statistics.median(r[pipeline][field] for r in rounds)  # noqa: E731
        cells = []
        for field, reference in (("tok_s", "one source"), ("tok_cpu_s", "one source"), ("tok_s", "one source, no cache")):
            ratios = [r[pipeline][field] / r[reference][field] for r in rounds]
            cells.append(f"{statistics.median(ratios):.3f} ({min(ratios):.3f})")
        print(f"{pipeline:22s} {med('tok_s') / 1e6:7.2f} {med('tok_cpu_s') / 1e6:10.2f} {cells[0]:>14s} {cells[1]:>16s} "
              f"{cells[2]:>17s}")
    print("(median (worst) over rounds; no cache: one source with data.cache.records: false, every epoch read from the "
          "files; not carried: the sources dropped at the parse, never counted; ours, no cache: the mixture with "
          "data.cache.records: false, compare it with one source, no cache)")
    for label, source in (("ours mixture (3)", ours), ("sample_from_datasets", theirs)):
        found = shares(source, args.records)
        print(f"{label:22s} shares {', '.join(f'{s:.4f}' for s in found['shares'])} of {args.records:,} records (weights "
              f"{WEIGHTS}); worst gap over prefixes >= 1,000: {found['worst_gap']:.4f} "
              f"({found['worst_gap_examples']:.0f} examples)", flush=True)


if __name__ == "__main__":
    main()
