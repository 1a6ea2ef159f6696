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

`demo`, `bench` and `doctor` all measure with this loop, so their figures mean the same thing: the
input pipeline alone (no model, no accelerator), over the timed batches after a warm-up on the same
iterator. `aggregate` gives one figure over several runs as their sum over their time (a median of
short runs hides the rare slow batch, e.g. a pack or bucket window being placed). A windowed
pipeline (data.sequence pack or bucket) built with `with_position=True` also reports how many
new windows the timed batches brought: a window is placed all at once, then its rows stream out
of memory, so batches that all come from windows placed before the timing leave the placing out
(`describe` says so). The warm-up's first batch is timed alone (`Meter.first_batch_seconds`):
start-up, the first file reads and the first window.
"""
from __future__ import annotations

import dataclasses
import resource
import statistics
import time
from typing import Any, Iterable, Optional

import psutil
import tensorflow as tf

from tpu_pipeline.pipeline.core.resume_position import POSITION_KEYS, last_position
from tpu_pipeline.pipeline.sequences.token_count import real_and_slots, real_examples, sequence_keys
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
    windows: int = -1  # windows first seen in the timed batches (pack, bucket); -1: not measured

    @property
    def non_padding_fraction(self) -> Optional[float]:
        """Real tokens / token slots over the measured batches; None for a pipeline without token keys."""
        return self.real_tokens / self.token_slots if self.token_slots else None

    def as_dict(self) -> dict[str, Any]:
        """Every field; the token fields (and `non_padding_fraction`) only for a pipeline with token keys."""
        fields = dataclasses.asdict(self)
        if self.windows < 0:
            fields.pop("windows")
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


def _window_key(position: Any) -> tf.Tensor:
    """What names the window of an element's last output: its position without the index in the window."""
    return last_position(position)[:-1]


def _later(key: tf.Tensor, than: tf.Tensor) -> tf.Tensor:
    """Whether window `key` comes after `than` in the stream (lexicographic, int64 vectors)."""
    diff = key - than
    first = tf.argmax(tf.cast(tf.not_equal(diff, 0), tf.int32))
    return tf.reduce_any(tf.not_equal(diff, 0)) & (tf.gather(diff, first) > 0)


@tf.function
def _consume(iterator: Any, batches: tf.Tensor, tokens: bool, positioned: bool,
             latest: tf.Tensor) -> tuple[tf.Tensor, ...]:
    """Takes up to `batches` batches; returns what they held and, for a positioned stream, how many
    windows later than `latest` (the latest window seen so far) they brought, and the latest then."""
    examples = tf.constant(0, tf.int64)
    num_bytes = tf.constant(0, tf.int64)
    done = tf.constant(0, tf.int64)
    real = tf.constant(0, tf.int64)
    slots = tf.constant(0, tf.int64)
    windows = tf.constant(0, tf.int64)
    for _ in tf.range(batches):
        optional = iterator.get_next_as_optional()
        if not optional.has_value():
            break
        element = optional.get_value()
        if positioned:  # a Python bool: (element, position) from build(with_position=True)
            element, position = element
            key = _window_key(position)
            later = _later(key, latest)
            windows += tf.cast(later, tf.int64)
            latest = tf.where(later, key, latest)
        num_bytes += _bytes(element)
        if tokens:  # a Python bool: one trace each way, nothing counted for other pipelines
            examples += real_examples(element)  # pack: segments, not rows; bucket: not the padding examples
            more_real, more_slots = real_and_slots(element)
            real += more_real
            slots += more_slots
        else:
            examples += _leading(element)
        done += 1
    return examples, num_bytes, done, real, slots, windows, latest


CHUNK = 64  # batches per call of the loop: a Ctrl-C waits for at most this many


class Meter:
    """Pulls batches from one iterator: `warm_up(n)` once, then `measure(n)` per repeat.

    `dataset` may be built with `with_position=True` (a windowed pipeline): its elements are then
    (batch, position), and each measurement counts the new windows its batches brought."""

    def __init__(self, dataset: tf.data.Dataset) -> None:
        spec = dataset.element_spec
        self.positioned = (isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], dict)
                           and set(spec[1]) == set(POSITION_KEYS))
        self.iterator = iter(dataset)
        self.tokens = bool(sequence_keys(spec[0] if self.positioned else spec))
        self.first_batch_seconds: Optional[float] = None  # the warm-up's first batch, alone
        # The latest window seen (none yet: below any real one); a scalar when there are no windows.
        width = int(_window_key(tf.nest.map_structure(
            lambda s: tf.zeros([d or 1 for d in s.shape], s.dtype), spec[1])).shape[0]) if self.positioned else 0
        self._latest = tf.fill([width], tf.constant(-(1 << 62), tf.int64))

    def _take(self, batches: int) -> tuple[int, ...]:
        """Up to `batches` batches, CHUNK per tf.function call: Python raises a Ctrl-C's KeyboardInterrupt
        only between calls, and a call costs ~0.1 ms, nothing beside CHUNK batches."""
        totals = [0] * 6
        while batches > 0:
            asked = min(batches, CHUNK)
            *counts, self._latest = _consume(self.iterator, tf.constant(asked, tf.int64), self.tokens,
                                             self.positioned, self._latest)
            totals = [total + int(count) for total, count in zip(totals, counts)]
            batches -= asked
            if int(counts[2]) < asked:
                break  # the data ended
        examples, num_bytes, done, real, slots, windows = totals
        return examples, num_bytes, done, real, slots, windows if self.positioned else -1

    def warm_up(self, batches: int) -> int:
        """Takes `batches` batches untimed (the first timed alone); returns how many there were."""
        done = 0
        if batches:
            start = time.perf_counter()
            done = self._take(1)[2]
            self.first_batch_seconds = time.perf_counter() - start
        if batches > 1 and done:
            done += self._take(batches - 1)[2]
        return done

    def measure(self, batches: int) -> Measurement:
        process = psutil.Process()
        cpu_before = sum(process.cpu_times()[:2])
        start = time.perf_counter()
        examples, num_bytes, done, real, slots, windows = self._take(batches)
        seconds = time.perf_counter() - start
        cpu = sum(process.cpu_times()[:2]) - cpu_before
        return Measurement(
            examples_per_sec=examples / seconds, batches_per_sec=done / seconds, bytes_per_sec=num_bytes / seconds,
            cpu_seconds_per_example=cpu / max(examples, 1), cores_used=cpu / seconds,
            peak_memory_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            seconds=seconds, examples=examples, batches=done,
            tokens_per_sec=real / seconds, real_tokens=real, token_slots=slots, windows=windows,
        )


def measure(dataset: Optional[tf.data.Dataset], batches: int, warmup: int = 5, repeats: int = 1,
            meter: Optional[Meter] = None) -> list[Measurement]:
    """Warm up, then `repeats` timed runs of `batches` batches on one iterator (`meter`'s, if given:
    its `first_batch_seconds` then says how long the first batch took)."""
    meter = meter or Meter(dataset)
    meter.warm_up(warmup)
    return [meter.measure(batches) for _ in range(repeats)]


def measure_to_a_new_window(meter: Meter, runs: list[Measurement], max_seconds: float) -> list[Measurement]:
    """`runs` of a pack or bucket pipeline, extended (each further run as long as all before it) until
    their batches bring a new window or `max_seconds` of timing is spent: a figure without one leaves
    out the placing of windows, which recurs. Other pipelines' runs come back as they are."""
    runs = list(runs)
    while (meter.positioned and runs and not sum(r.windows for r in runs)
           and sum(r.seconds for r in runs) < max_seconds):
        runs.append(meter.measure(sum(r.batches for r in runs)))
        if not runs[-1].batches:
            break  # the data ended
    return runs


def aggregate(measurements: Iterable[Measurement]) -> Measurement:
    """One figure over all runs: what they delivered over the time they took (rates), summed counts,
    new windows in all; CPU per example and cores over all runs; peak memory: the maximum."""
    items = list(measurements)
    seconds = sum(m.seconds for m in items)
    examples, batches = sum(m.examples for m in items), sum(m.batches for m in items)
    real, slots = sum(m.real_tokens for m in items), sum(m.token_slots for m in items)
    cpu = sum(m.cpu_seconds_per_example * max(m.examples, 1) for m in items)
    return Measurement(
        examples_per_sec=examples / seconds, batches_per_sec=batches / seconds,
        bytes_per_sec=sum(m.bytes_per_sec * m.seconds for m in items) / seconds,
        cpu_seconds_per_example=cpu / max(examples, 1), cores_used=cpu / seconds,
        peak_memory_bytes=max(m.peak_memory_bytes for m in items), seconds=seconds, examples=examples,
        batches=batches, tokens_per_sec=real / seconds, real_tokens=real, token_slots=slots,
        windows=sum(m.windows for m in items) if all(m.windows >= 0 for m in items) else -1,
    )


def describe(measurement: Measurement, warmup: int, first_batch_seconds: Optional[float] = None) -> str:
    """What a figure of `measurement` means, in words (demo, bench and doctor print it the same way)."""
    first = f"; the first took {first_batch_seconds:.2f} s" if first_batch_seconds is not None else ""
    line = (f"the input pipeline alone (no model): {measurement.batches:,} batches in {measurement.seconds:.2f} s, "
            f"after {warmup} warm-up batch(es){first}")
    if measurement.windows > 0:
        line += f"; they brought {measurement.windows} new pack/bucket window(s), so placing windows is in the figure"
    elif measurement.windows == 0:
        line += ("; every timed batch came from a pack/bucket window placed before the timing began, so placing a "
                 "window (it recurs, window after window; the first batch waited for one) is not in this figure: "
                 "time more batches to include it")
    return line


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
    for name in ("examples", "batches", "windows"):
        fields[name] = int(fields[name])
    # The fraction is a ratio of sums: over all runs, not a median of medians.
    fields["real_tokens"] = sum(m.real_tokens for m in items)
    fields["token_slots"] = sum(m.token_slots for m in items)
    return Measurement(**fields)
