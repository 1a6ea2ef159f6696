"""`tpu-pipeline demo`: builds the input pipeline from a config and prints its throughput.

`--show N` draws the first N examples instead, augmented, with their labels, as one PNG contact sheet
(`bench.contact_sheet`); for a token pipeline (data.sequence) it prints the first N rows as text instead, each
segment decoded with its dataset's tokenizer and the trained-on targets marked (`bench.token_rows`). `--explain` prints the pipeline's plan first: each decision (parse mode, shuffle, record cache,
order, ...) with the reason it was made. The throughput is measured as `bench` and `doctor`
measure it (`tpu_pipeline.bench.measure`: the same loop, the input pipeline alone, after a warm-up
on the same iterator), and the output says what the figure covers. For a data.sequence config the
throughput line also gives tokens/s (real tokens of the first token key) and the non-padding
fraction (real tokens / token slots; `tpu_pipeline.pipeline.sequences.token_count`), and examples/s
counts real examples (in pack mode, the examples in the rows). A mixture also gets the shares each source
was delivered at, beside the weights (`pipeline.mixtures.share_meter`).
"""
from __future__ import annotations

from typing import Sequence

from absl import flags

from tpu_pipeline.commands._common import load
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.pipeline.mixtures.share_meter import shares_line, with_source_meter

flags.DEFINE_integer("steps", 200, "batches to time (after the warm-up)")
flags.DEFINE_integer("warmup", 20, "batches to skip before timing (fills caches and buffers)")
flags.DEFINE_bool("explain", False, "print what the pipeline decided from the config, and why, before timing it")
flags.DEFINE_integer("show", 0, "write the first N examples the pipeline delivers (augmented, with their labels or soft "
                     "targets) as one PNG contact sheet at --show_path, instead of timing it; token rows "
                     "(data.sequence) are printed as text, the targets trained on marked")
flags.DEFINE_string("show_path", "contact_sheet.png", "where --show writes its image (.png, or .jpg: smaller)")
FLAGS = flags.FLAGS


def run(overrides: Sequence[str]) -> int:
    from tpu_pipeline.bench.measure import Meter, describe

    config = load(overrides)
    if config.data is None:
        raise ConfigError("the config has no 'data' section to build a pipeline from")
    pipeline, sources = with_source_meter(Pipeline.from_config(config.data))
    if FLAGS.explain:
        print("plan (what the pipeline decided, and why):")
        print(pipeline.plan.explain())
    if FLAGS.show and config.data.sequence is not None:
        from tpu_pipeline.bench.token_rows import token_rows
        from tpu_pipeline.format.tokenizer import dataset_tokenizer

        sources = [config.data.source] + [entry.source for entry in (config.data.mixture.sources if config.data.mixture else [])]
        directories = [source.dir for source in sources if source is not None and source.dir]
        if not directories:
            raise ConfigError("--show on token rows decodes them with a converted dataset's tokenizer: give data.source.dir "
                              "(a `tpu-pipeline convert --from text|chat` output)")
        print(token_rows(pipeline.build(), FLAGS.show, dataset_tokenizer(directories[0])))
        return 0
    if FLAGS.show:
        from tpu_pipeline.bench.contact_sheet import write_contact_sheet

        width, height = write_contact_sheet(pipeline.build(), FLAGS.show, FLAGS.show_path)
        print(f"contact sheet: {FLAGS.show} examples of data (as the training pipeline delivers them, augmentation "
              f"included) in {FLAGS.show_path} ({width} x {height} pixels)")
        return 0
    windowed = pipeline.windowed
    dataset = pipeline.build(with_position=windowed is not None)
    meter = Meter(dataset)
    print(f"element spec: {dataset.element_spec[0] if meter.positioned else dataset.element_spec}")
    warmed = meter.warm_up(FLAGS.warmup)
    measured = meter.measure(FLAGS.steps) if warmed == FLAGS.warmup else None
    if measured is None or not measured.batches:
        raise ConfigError(
            f"data: the pipeline ended after {warmed} batch(es), before the {FLAGS.warmup} warm-up batches and the "
            "timed ones, so there is nothing left to time; set data.repeat=forever (e.g. `demo ... "
            "data.repeat=forever`) or a smaller --warmup"
        )
    print(
        f"throughput: {measured.examples_per_sec:,.0f} examples/s, {measured.batches_per_sec:,.1f} batches/s "
        f"({measured.batches} batches of global size {config.data.batch_size} in {measured.seconds:.2f} s after "
        f"{FLAGS.warmup} warm-up batches)"
    )
    if measured.token_slots:
        from tpu_pipeline.pipeline.sequences.token_count import sequence_keys

        key = sequence_keys(dataset.element_spec[0] if meter.positioned else dataset.element_spec)[0].name
        print(f"tokens: {measured.tokens_per_sec:,.0f} tokens/s, non-padding fraction {measured.non_padding_fraction:.3f} "
              f"({measured.real_tokens:,} real tokens of {measured.token_slots:,} slots of '{key}', "
              f"data.sequence.mode={pipeline.sequence_mode})")
    if sources is not None:  # a mixture: what the batches read held of each source, beside its weight
        print(f"{shares_line(config.data.mixture, *sources.totals())} (weights in brackets; counted as the batches "
              "were made, warm-up and prefetched ones included)")
    print("measured: " + describe(measured, FLAGS.warmup, meter.first_batch_seconds))
    return 0
