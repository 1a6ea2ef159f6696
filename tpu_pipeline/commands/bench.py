"""`tpu-pipeline bench --config FILE [--steps N] [--json out.json]`: one pipeline's throughput.

Prints medians over --repeats timed runs of --steps batches (after a warm-up on the same iterator):
examples/s, batches/s, bytes/s, CPU time per example, cores used, peak memory, and both ceilings.
"""
from __future__ import annotations

import json
import statistics
from typing import Sequence

from absl import flags

from tpu_pipeline.commands._common import load
from tpu_pipeline.errors import ConfigError

flags.DEFINE_integer("steps", 50, "batches per timed run")
flags.DEFINE_integer("repeats", 5, "timed runs (medians are reported)")
flags.DEFINE_integer("warmup", 10, "batches before timing (fills shuffle and prefetch buffers)")
flags.DEFINE_string("json", None, "also write the results here, for scripts")
flags.DEFINE_enum("section", "data", ["data", "eval_data"], "which pipeline of the config")
flags.DEFINE_boolean("ceilings", True, "also measure the compute-bound and read-bound ceilings")
FLAGS = flags.FLAGS


def run(overrides: Sequence[str]) -> int:
    from tpu_pipeline.bench.ceilings import measure_ceilings
    from tpu_pipeline.bench.measure import available_cores, measure, summarize
    from tpu_pipeline.pipeline import Pipeline

    config = getattr(load(overrides), FLAGS.section)
    if config is None:
        raise ConfigError(f"the config has no '{FLAGS.section}' section to benchmark")
    config = config.model_copy(update={"repeat": "forever"})
    cores = available_cores()
    runs = measure(Pipeline.from_config(config).build(), FLAGS.steps, FLAGS.warmup, FLAGS.repeats)
    median = summarize(runs)
    spread = statistics.pstdev(r.examples_per_sec for r in runs) / median.examples_per_sec
    print(f"{FLAGS.section}: {FLAGS.repeats} runs of {FLAGS.steps} batches (global batch {config.batch_size}), medians:")
    print(f"  examples/s          {median.examples_per_sec:14,.0f}   (spread {spread:.1%})")
    print(f"  batches/s           {median.batches_per_sec:14,.1f}")
    print(f"  bytes/s             {median.bytes_per_sec / 2**20:14,.1f} MiB")
    print(f"  CPU per example     {median.cpu_seconds_per_example * 1e6:14,.1f} us")
    print(f"  cores used          {median.cores_used:14.2f} of {cores}")
    print(f"  peak memory         {median.peak_memory_bytes / 2**20:14,.0f} MiB")
    result = {"section": FLAGS.section, "cores": cores, "median": median.as_dict(), "runs": [r.as_dict() for r in runs]}
    if FLAGS.ceilings:
        ceilings = measure_ceilings(config, cores)
        print(f"  ceiling (a) compute {ceilings.compute_bound:14,.0f}   ({ceilings.one_thread.examples_per_sec:,.0f}/s on one thread x {cores} cores)")
        if ceilings.read_bound:
            cached = "" if ceilings.reads_files_every_epoch else "; first epoch only: cached after it"
            print(f"  ceiling (b) read    {ceilings.read_bound:14,.0f}   (files read sequentially + batched, no parse{cached})")
        print(f"  fraction of limit   {median.examples_per_sec / ceilings.limit:14.2f}")
        result["ceilings"] = ceilings.as_dict()
        result["fraction_of_limit"] = median.examples_per_sec / ceilings.limit
    if FLAGS.json:
        with open(FLAGS.json, "w") as handle:
            json.dump(result, handle, indent=2)
    return 0
