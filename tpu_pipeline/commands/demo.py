"""`tpu-pipeline demo`: builds the input pipeline from a config and prints its throughput.

`--explain` prints the pipeline's plan first: each decision (parse mode, shuffle, record cache,
order, ...) with the reason it was made. For a data.sequence config the throughput line also
gives tokens/s (real tokens of the first token key) and the non-padding fraction (real tokens /
token slots; `tpu_pipeline.pipeline.efficiency`), and examples/s counts real examples (in pack
mode, the examples in the rows).
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import tensorflow as tf
from absl import flags

from tpu_pipeline.commands._common import load
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.pipeline.efficiency import real_and_slots, real_examples, sequence_keys

flags.DEFINE_integer("steps", 200, "batches to time (after the warm-up)")
flags.DEFINE_integer("warmup", 20, "batches to skip before timing (fills caches and buffers)")
flags.DEFINE_bool("explain", False, "print what the pipeline decided from the config, and why, before timing it")
FLAGS = flags.FLAGS


def run(overrides: Sequence[str]) -> int:
    config = load(overrides)
    if config.data is None:
        raise ConfigError("the config has no 'data' section to build a pipeline from")
    pipeline = Pipeline.from_config(config.data)
    if FLAGS.explain:
        print("plan (what the pipeline decided, and why):")
        print(pipeline.plan.explain())
    dataset = pipeline.build()
    print(f"element spec: {dataset.element_spec}")
    keys = sequence_keys(dataset.element_spec)
    count = _token_counter(dataset.element_spec) if keys else None
    iterator = iter(dataset)
    for warmed in range(FLAGS.warmup):
        if next(iterator, None) is None:
            raise ConfigError(
                f"data: the pipeline ended after {warmed} batch(es), before the {FLAGS.warmup} warm-up batches, so "
                "there is nothing left to time; set data.repeat=forever (e.g. `demo ... data.repeat=forever`) or a "
                "smaller --warmup"
            )
    examples = real = slots = 0
    start = time.perf_counter()
    steps = 0
    for steps in range(1, FLAGS.steps + 1):
        try:
            batch = next(iterator)
        except StopIteration:
            steps -= 1
            break
        if count is not None:
            more_examples, more_real, more_slots = (int(v) for v in count(batch))
            examples, real, slots = examples + more_examples, real + more_real, slots + more_slots
        else:
            examples += int(tf.nest.flatten(batch)[0].shape[0])
    seconds = time.perf_counter() - start
    print(
        f"throughput: {examples / seconds:,.0f} examples/s, {steps / seconds:,.1f} batches/s "
        f"({steps} batches of global size {config.data.batch_size} in {seconds:.2f} s after {FLAGS.warmup} warm-up batches)"
    )
    if count is not None:
        print(f"tokens: {real / seconds:,.0f} tokens/s, non-padding fraction {real / max(slots, 1):.3f} "
              f"({real:,} real tokens of {slots:,} slots of '{keys[0].name}', data.sequence.mode={config.data.sequence.mode})")
    return 0


def _token_counter(spec: Any) -> Any:
    """(examples, real tokens, token slots) of a batch, as one call traced before the timing starts
    (for the element spec: every bucket's shape takes the one trace)."""
    @tf.function
    def count(batch: Any) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        real, slots = real_and_slots(batch)
        return real_examples(batch), real, slots

    return count.get_concrete_function(spec)
