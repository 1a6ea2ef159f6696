"""Throughput of a dataset, measured the way an accelerator consumes it.

Batches are pulled inside a `tf.function` loop (no Python per batch, which would cost more than a
small-record batch itself), after a warm-up on the same iterator. Each repeat reports examples/s,
batches/s, bytes/s, CPU seconds per example (all threads of this process), cores used and peak
memory; `summarize` takes medians over repeats. For a data.sequence pipeline (batches with
`<key>_mask` or `<key>_segment_ids`, `pipeline.efficiency`), each run also counts real tokens and
token slots of the first token key in the same loop: tokens/s (real tokens) and the non-padding
fraction (real / slots); its examples are real examples (pack: the segments of each row, not the
rows; bucket: not the padding examples that fill a bucket's last batch), so examples/s means one
thing in every mode and beside the read-bound ceiling (records).
"""
from __future__ import annotations

import dataclasses
import resource
import statistics
import time
from typing import Any, Iterable, Optional

import psutil
import tensorflow as tf

from tpu_pipeline.pipeline.efficiency import real_and_slots, real_examples, sequence_keys
from tpu_pipeline.system import available_cores  # noqa: F401  (re-exported for callers)


@dataclasses.dataclass(frozen=True)
class Measurement:
    examples_per_sec: float
    batches_per_sec: float
    bytes_per_sec: float
    cpu_seconds_per_example: float
    cores_used: float
    peak_memory_bytes: int
    seconds: float
    examples: int
    batches: int
    tokens_per_sec: float = 0.0  # real tokens of the first token key (data.sequence pipelines; else 0)
    real_tokens: int = 0
    token_slots: int = 0  # all positions of that key: real_tokens / token_slots is the non-padding fraction

    @property
    def non_padding_fraction(self) -> Optional[float]:
        """Real tokens / token slots over the measured batches; None for a pipeline without token keys."""
        return self.real_tokens / self.token_slots if self.token_slots else None

    def as_dict(self) -> dict[str, Any]:
        """Every field; the token fields (and `non_padding_fraction`) only for a pipeline with token keys."""
        fields = dataclasses.asdict(self)
        if not self.token_slots:
            return {k: v for k, v in fields.items() if k not in TOKEN_FIELDS}
        return {**fields, "non_padding_fraction": self.non_padding_fraction}


TOKEN_FIELDS = ("tokens_per_sec", "real_tokens", "token_slots")


def _leading(element: Any) -> tf.Tensor:
    first = tf.nest.flatten(element)[0]
    return tf.shape(first, out_type=tf.int64)[0]


def _bytes(element: Any) -> tf.Tensor:
    total = tf.constant(0, tf.int64)
    for tensor in tf.nest.flatten(element):
        if tensor.dtype == tf.string:
            total += tf.reduce_sum(tf.cast(tf.strings.length(tensor), tf.int64))
        else:
            total += tf.size(tensor, out_type=tf.int64) * tensor.dtype.size
    return total


@tf.function
def _consume(iterator: Any, batches: tf.Tensor, tokens: bool) -> tuple[tf.Tensor, ...]:
    examples = tf.constant(0, tf.int64)
    num_bytes = tf.constant(0, tf.int64)
    done = tf.constant(0, tf.int64)
    real = tf.constant(0, tf.int64)
    slots = tf.constant(0, tf.int64)
    for _ in tf.range(batches):
        optional = iterator.get_next_as_optional()
        if not optional.has_value():
            break
        element = optional.get_value()
        num_bytes += _bytes(element)
        if tokens:  # a Python bool: one trace each way, nothing counted for other pipelines
            examples += real_examples(element)  # pack: segments, not rows; bucket: not the padding examples
            more_real, more_slots = real_and_slots(element)
            real += more_real
            slots += more_slots
        else:
            examples += _leading(element)
        done += 1
    return examples, num_bytes, done, real, slots


class Meter:
    """Pulls batches from one iterator: `warm_up(n)` once, then `measure(n)` per repeat."""

    def __init__(self, dataset: tf.data.Dataset) -> None:
        self.iterator = iter(dataset)
        self.tokens = bool(sequence_keys(dataset.element_spec))

    def warm_up(self, batches: int) -> None:
        if batches:
            _consume(self.iterator, tf.constant(batches, tf.int64), self.tokens)

    def measure(self, batches: int) -> Measurement:
        process = psutil.Process()
        cpu_before = sum(process.cpu_times()[:2])
        start = time.perf_counter()
        examples, num_bytes, done, real, slots = (
            int(v) for v in _consume(self.iterator, tf.constant(batches, tf.int64), self.tokens))
        seconds = time.perf_counter() - start
        cpu = sum(process.cpu_times()[:2]) - cpu_before
        return Measurement(
            examples_per_sec=examples / seconds, batches_per_sec=done / seconds, bytes_per_sec=num_bytes / seconds,
            cpu_seconds_per_example=cpu / max(examples, 1), cores_used=cpu / seconds,
            peak_memory_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            seconds=seconds, examples=examples, batches=done,
            tokens_per_sec=real / seconds, real_tokens=real, token_slots=slots,
        )


def measure(dataset: tf.data.Dataset, batches: int, warmup: int = 5, repeats: int = 1) -> list[Measurement]:
    """Warm up, then `repeats` timed runs of `batches` batches on one iterator."""
    meter = Meter(dataset)
    meter.warm_up(warmup)
    return [meter.measure(batches) for _ in range(repeats)]


def measure_for(dataset: tf.data.Dataset, seconds: float, warmup: int = 2, repeats: int = 3, min_batches: int = 3) -> list[Measurement]:
    """Like `measure`, but each timed run lasts about `seconds`: short runs are dominated by the
    fixed cost of starting one (milliseconds), which would make cheap stages look expensive."""
    meter = Meter(dataset)
    meter.warm_up(warmup)
    probe = meter.measure(min_batches)
    batches = max(min_batches, int(probe.batches_per_sec * seconds))
    return [meter.measure(batches) for _ in range(repeats)]


def summarize(measurements: Iterable[Measurement]) -> Measurement:
    """Medians of every field (peak memory: the maximum)."""
    items = list(measurements)
    fields = {f.name: statistics.median(getattr(m, f.name) for m in items) for f in dataclasses.fields(Measurement)}
    fields["peak_memory_bytes"] = max(m.peak_memory_bytes for m in items)
    for name in ("examples", "batches"):
        fields[name] = int(fields[name])
    # The fraction is a ratio of sums: over all runs, not a median of medians.
    fields["real_tokens"] = sum(m.real_tokens for m in items)
    fields["token_slots"] = sum(m.token_slots for m in items)
    return Measurement(**fields)
