"""`tpu-pipeline bench --config FILE [--steps N] [--json out.json]`: one pipeline's throughput.

Prints, over --repeats timed runs of --steps batches (after a warm-up on the same iterator), what
they delivered over the time they took (`bench.measure.aggregate`; the spread is that of the runs):
examples/s, batches/s, bytes/s, CPU time per example, cores used, peak memory, and both ceilings.
`demo` and `doctor` measure with the same loop; the output's `measured:` line says what it covers.
A data.sequence pipeline also gets tokens/s (real tokens of its first token key) and the
non-padding fraction (real tokens / token slots; `tpu_pipeline.pipeline.sequences.token_count`); its
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
flags.DEFINE_integer("repeats", 5, "timed runs (reported together: their sum over their time; the JSON also has medians)")
flags.DEFINE_integer("warmup", 10, "batches before timing (fills shuffle and prefetch buffers)")
flags.DEFINE_string("json", None, "also write the results here, for scripts")
flags.DEFINE_enum("section", "data", ["data", "eval_data"], "which pipeline of the config")
flags.DEFINE_boolean("ceilings", True, "also measure the compute-bound and read-bound ceilings")
FLAGS = flags.FLAGS


def run(overrides: Sequence[str]) -> int:
    from tpu_pipeline.bench.ceilings import measure_ceilings
    from tpu_pipeline.bench.measure import Meter, aggregate, available_cores, describe, measure, summarize
    from tpu_pipeline.pipeline.builder import Pipeline
    from tpu_pipeline.pipeline.mixtures.share_meter import mixture_counts, shares_line, with_source_meter
    from tpu_pipeline.pipeline.sequences.token_count import sequence_keys

    config = getattr(load(overrides), FLAGS.section)
    if config is None:
        raise ConfigError(f"the config has no '{FLAGS.section}' section to benchmark")
    config = config.model_copy(update={"repeat": "forever"})
    cores = available_cores()
    pipeline, sources = with_source_meter(Pipeline.from_config(config))
    dataset = pipeline.build(with_position=pipeline.windowed is not None)
    meter = Meter(dataset)
    runs = measure(dataset, FLAGS.steps, FLAGS.warmup, FLAGS.repeats, meter=meter)
    total = aggregate(runs)  # the runs' sum over their time (not a median of them: that would hide slow batches)
    spread = statistics.pstdev(r.examples_per_sec for r in runs) / total.examples_per_sec
    mode = pipeline.sequence_mode
    rows = f" {mode.row_name}" if mode is not None and mode.row_name else ""
    print(f"{FLAGS.section}: {FLAGS.repeats} runs of {FLAGS.steps} batches (global batch {config.batch_size}{rows}), "
          "all runs together:")
    print(f"  examples/s          {total.examples_per_sec:14,.0f}   (spread {spread:.1%})")
    if total.non_padding_fraction is not None:
        key = sequence_keys(dataset.element_spec[0] if meter.positioned else dataset.element_spec)[0].name
        print(f"  tokens/s            {total.tokens_per_sec:14,.0f}   (real tokens of {key}; padding not counted)")
        print(f"  non-padding         {total.non_padding_fraction:14.1%}   ({total.real_tokens:,} real of {total.token_slots:,} slots "
              f"of '{key}'; data.sequence.mode={mode})")
    if sources is not None:  # a mixture: the shares its batches held, beside the weights
        examples, tokens = sources.totals()
        print(f"  {shares_line(config.mixture, examples, tokens)} (weights in brackets)")
    print(f"  batches/s           {total.batches_per_sec:14,.1f}")
    print(f"  bytes/s             {total.bytes_per_sec / 2**20:14,.1f} MiB")
    print(f"  CPU per example     {total.cpu_seconds_per_example * 1e6:14,.1f} us")
    print(f"  cores used          {total.cores_used:14.2f} of {cores}")
    print(f"  peak memory         {total.peak_memory_bytes / 2**20:14,.0f} MiB")
    measured = describe(total, FLAGS.warmup, meter.first_batch_seconds)
    print(f"  measured: {measured}")
    # "median": each field's median over the runs; "total": the runs together (what is printed).
    result = {"section": FLAGS.section, "cores": cores, "median": summarize(runs).as_dict(), "total": total.as_dict(),
              "measured": measured, "runs": [r.as_dict() for r in runs]}
    if total.non_padding_fraction is not None:
        result["token_key"] = sequence_keys(dataset.element_spec[0] if meter.positioned else dataset.element_spec)[0].name
    if sources is not None:
        result["sources"] = mixture_counts(config.mixture, *sources.totals())
    if FLAGS.ceilings:
        ceilings = measure_ceilings(config, cores)
        print(f"  ceiling (a) compute {ceilings.compute_bound:14,.0f}   ({ceilings.one_thread.examples_per_sec:,.0f}/s on one thread x {cores} cores)")
        if ceilings.read_bound:
            cached = "" if ceilings.reads_files_every_epoch else "; first epoch only: cached after it"
            print(f"  ceiling (b) read    {ceilings.read_bound:14,.0f}   (files read sequentially + batched, no parse{cached})")
        print(f"  fraction of limit   {total.examples_per_sec / ceilings.limit:14.2f}")
        result["ceilings"] = ceilings.as_dict()
        result["fraction_of_limit"] = total.examples_per_sec / ceilings.limit
    if FLAGS.json:
        with open(FLAGS.json, "w") as handle:
            json.dump(result, handle, indent=2)
    return 0
