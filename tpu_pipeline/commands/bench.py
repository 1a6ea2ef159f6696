"""`tpu-pipeline bench --config FILE [--steps N] [--json out.json]`: one pipeline's throughput.

Prints medians over --repeats timed runs of --steps batches (after a warm-up on the same iterator):
examples/s, batches/s, bytes/s, CPU time per example, cores used, peak memory, and both ceilings.
A data.sequence pipeline also gets tokens/s (real tokens of its first token key) and the
non-padding fraction (real tokens / token slots; `tpu_pipeline.pipeline.efficiency`); its
examples/s counts real examples (in pack mode, the examples in the rows, not the rows).
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
    from tpu_pipeline.pipeline.efficiency import sequence_keys

    config = getattr(load(overrides), FLAGS.section)
    if config is None:
        raise ConfigError(f"the config has no '{FLAGS.section}' section to benchmark")
    config = config.model_copy(update={"repeat": "forever"})
    cores = available_cores()
    dataset = Pipeline.from_config(config).build()
    runs = measure(dataset, FLAGS.steps, FLAGS.warmup, FLAGS.repeats)
    median = summarize(runs)
    spread = statistics.pstdev(r.examples_per_sec for r in runs) / median.examples_per_sec
    rows = " packed rows" if config.sequence is not None and config.sequence.mode == "pack" else ""
    print(f"{FLAGS.section}: {FLAGS.repeats} runs of {FLAGS.steps} batches (global batch {config.batch_size}{rows}), medians:")
    print(f"  examples/s          {median.examples_per_sec:14,.0f}   (spread {spread:.1%})")
    if median.non_padding_fraction is not None:
        key = sequence_keys(dataset.element_spec)[0].name
        mode = config.sequence.mode if config.sequence is not None else "?"
        print(f"  tokens/s            {median.tokens_per_sec:14,.0f}   (real tokens of {key}; padding not counted)")
        print(f"  non-padding         {median.non_padding_fraction:14.1%}   ({median.real_tokens:,} real of {median.token_slots:,} slots "
              f"of '{key}'; data.sequence.mode={mode})")
    print(f"  batches/s           {median.batches_per_sec:14,.1f}")
    print(f"  bytes/s             {median.bytes_per_sec / 2**20:14,.1f} MiB")
    print(f"  CPU per example     {median.cpu_seconds_per_example * 1e6:14,.1f} us")
    print(f"  cores used          {median.cores_used:14.2f} of {cores}")
    print(f"  peak memory         {median.peak_memory_bytes / 2**20:14,.0f} MiB")
    result = {"section": FLAGS.section, "cores": cores, "median": median.as_dict(), "runs": [r.as_dict() for r in runs]}
    if median.non_padding_fraction is not None:
        result["token_key"] = sequence_keys(dataset.element_spec)[0].name
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
