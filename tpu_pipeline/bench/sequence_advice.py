"""How much of a data.sequence pipeline's batches is tokens, and what would raise it: the doctor's advice.

`sequence_report` gives the non-padding fraction over the timed batches, and on a sample of the
stream's examples (their lengths, read through a pad-mode copy of the config, in stream order) the
fraction the configured mode reaches and the one another mode or window would: pad and bucket by
arithmetic on the lengths, pack by running the pipeline's own packer (`packing.pack_window`) over
windows of them. Those proposals change what the model reads (segment ids in pack mode), so they
are advice, kept out of the tuned config. `long_examples` warns of examples far longer than a row.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from tpu_pipeline.bench.finding import Finding
from tpu_pipeline.bench.measure import Measurement
from tpu_pipeline.config.data import DataConfig, ServiceConfig
from tpu_pipeline.format.record_limits import MAX_RECORD_TOKENS
from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.pipeline.plan import Plan
from tpu_pipeline.pipeline.sequences.fill_estimates import pack_fraction, pad_fraction
from tpu_pipeline.pipeline.sequences.modes.registry import sequence_mode
from tpu_pipeline.pipeline.sequences.placement import xla_on_cpu
from tpu_pipeline.pipeline.sequences.token_count import example_lengths, sequence_keys

LOW_FRACTION = 0.7  # pad or bucket below this share of tokens: pack is worth its segment ids
PACK_WINDOW = 1024  # the window pack mode measured best (docs/sequences.md; the plan's auto)
SAMPLE_EXAMPLES = 4096  # examples whose lengths the estimates use (at most)
WINDOW_GAIN = 0.005  # a larger window is proposed when it packs at least half a point denser


@dataclasses.dataclass(frozen=True)
class SequenceReport:
    """How much of a data.sequence pipeline's batches is tokens, and what would raise it."""

    key: str  # the token key counted (the first; pipeline.efficiency)
    mode: str
    length: int
    window: int  # bucket, pack: examples per window (0: pad)
    examples: int  # examples in the sample
    lengths: tuple[int, int, float]  # shortest, longest, median of the sample (after truncation to length)
    fraction: float  # as configured, on the sample
    measured: Optional[float]  # over the timed batches (None: not measured)
    tokens_per_sec: float  # real tokens of `key`, timed batches
    findings: list[Finding]  # each: the fraction it would reach, and the override
    long: Optional["LongExamples"] = None  # examples far longer than length, uncut (None: none, or not measured)
    placement: str = ""  # pack mode: how this TensorFlow places rows (with XLA or without), one line

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "mode": self.mode, "length": self.length, "window": self.window,
                "examples_seen": self.examples, "shortest": self.lengths[0], "longest": self.lengths[1],
                "median": self.lengths[2], "non_padding_fraction": self.fraction,
                "measured_non_padding_fraction": self.measured, "tokens_per_sec": self.tokens_per_sec,
                "findings": [{"problem": f.problem, "overrides": list(f.overrides)} for f in self.findings],
                "long_examples": dataclasses.asdict(self.long) if self.long else None,
                "placement": self.placement or None}

    def lines(self) -> list[str]:
        low, high, median = self.lengths
        window = f", window {self.window}" if self.window else ""
        lines = [f"sequence: {self.mode} to {self.length}{window}; key '{self.key}', {self.examples:,} examples seen "
                 f"(lengths {low}..{high}, median {median:g})"]
        measured = (f"{self.measured:.3f} over the timed batches ({self.tokens_per_sec:,.0f} tokens/s), "
                    if self.measured is not None else "")
        lines.append(f"  non-padding fraction: {measured}{self.fraction:.3f} on the examples seen")
        if self.placement:
            lines.append(f"  placement: {self.placement}")
        if self.long is not None:
            lines.append(self.long.line(self.length))
        for finding in self.findings:
            lines.append(f"  - {finding.problem}\n      fix (advice, not in the tuned config): {' '.join(finding.overrides)}")
        if not self.findings:
            lines.append(f"  nothing to raise it: {self.mode} mode is at {self.fraction:.0%} of the slots" if self.fraction
                         >= LOW_FRACTION else "  no mode or window found that would raise it on these examples")
        return lines


FAR_LONGER = 8  # an example over this many times data.sequence.length is "far longer": doctor warns


@dataclasses.dataclass(frozen=True)
class LongExamples:
    """Examples of the sample far longer than a row (uncut, in tokens), and what the pipeline does with them."""

    count: int  # over FAR_LONGER × length
    seen: int
    longest: int
    tokens: int  # theirs, in all
    overflow: str  # data.sequence.overflow

    def line(self, length: int) -> str:
        kept = {"split": f"overflow: split cuts each into chunks of {length} tokens, each its own segment (the "
                         f"longest into {-(-self.longest // length):,}; no attention across chunks)",
                "truncate": f"overflow: truncate keeps only the first {length} tokens of each, dropping "
                            f"{1 - self.count * length / max(self.tokens, 1):.1%} of their tokens",
                "error": "overflow: error refuses them (the pipeline stops at the first)"}[self.overflow]
        whole = (f"; a record over {MAX_RECORD_TOKENS:,} tokens costs memory in proportion where it is parsed "
                 "(~100 bytes a token): convert it again with `tpu-pipeline convert --from text`, which stores long "
                 f"documents as records of at most {MAX_RECORD_TOKENS:,}" if self.longest > MAX_RECORD_TOKENS else "")
        return (f"  warning: {self.count:,} of the {self.seen:,} examples seen are over {FAR_LONGER} x length "
                f"({FAR_LONGER * length:,} tokens; the longest {self.longest:,}): {kept}{whole}")


def long_examples(config: DataConfig, key: str, length: int, sample: int = SAMPLE_EXAMPLES) -> Optional[LongExamples]:
    """The examples far longer than `length` among the stream's first `sample`, uncut (read without the
    sequence stage); None when there are none, or when the stream cannot be batched uncut."""
    copy = config.model_copy(update={"sequence": None, "repeat": 1, "outputs": None, "service": ServiceConfig()})
    try:
        dataset = Pipeline.from_config(copy).build()
        spec = dataset.element_spec.get(key) if isinstance(dataset.element_spec, dict) else None
        if not isinstance(spec, tf.RaggedTensorSpec):
            return None
        lengths = np.asarray([int(n) for n in dataset.map(lambda batch: batch[key].row_lengths()).unbatch().take(sample)
                              .as_numpy_iterator()], np.int64)
    except (tf.errors.OpError, ValueError, TypeError):
        return None  # e.g. examples parsed one at a time: uncut, they cannot be batched
    far = lengths[lengths > FAR_LONGER * length]
    if not len(far):
        return None
    return LongExamples(int(len(far)), int(len(lengths)), int(far.max()), int(far.sum()), config.sequence.resolved_overflow())


def sequence_report(config: DataConfig, plan: Plan, measured: Optional[Measurement] = None,
                    sample: int = SAMPLE_EXAMPLES) -> Optional[SequenceReport]:
    """The non-padding fraction of a data.sequence pipeline and what would raise it; None without one.

    The lengths come from a pad-mode copy of the config (one pass at most, `sample` examples, stream
    order: a bucket or pack pipeline's first batches are not a fair sample of its windows). Estimates:
    pad and bucket by arithmetic, pack by running `packing.pack_window` over windows of the lengths.
    `measured`: the timed run of the configured pipeline, for its fraction and tokens/s."""
    sequence = plan.sequence.value
    if sequence is None or config.sequence is None:
        return None
    padded = config.sequence.model_copy(update={"mode": "pad", "overflow": "truncate", "boundaries": None,
                                                "bucket_batch": "examples"})
    copy = config.model_copy(update={"sequence": padded, "repeat": 1, "outputs": None, "service": ServiceConfig()})
    dataset = Pipeline.from_config(copy).build()
    key = sequence_keys(dataset.element_spec)[0].name
    lengths = [int(n) for n in dataset.map(lambda batch: example_lengths(batch, key)).unbatch().take(sample)
               .as_numpy_iterator()]
    if not lengths:
        return None
    length = int(sequence.lengths[key])
    mode = sequence_mode(sequence.mode)
    fraction = mode.fraction(lengths, sequence, config.batch_size, length)
    findings: list[Finding] = []
    seen = f"on the {len(lengths):,} examples seen"
    if mode.packs_denser and fraction < LOW_FRACTION:
        packed = pack_fraction(lengths, length, PACK_WINDOW)
        if packed > fraction:
            others = sorted(set(copy.features) - set(sequence.lengths)) if copy.features else []
            refused = f"; pack mode refuses the other features ({', '.join(others)}): drop them first" if others else ""
            findings.append(Finding(
                f"{fraction:.0%} of the token slots are tokens ({sequence.mode} to {length}): mode: pack would put "
                f"~{packed:.0%} tokens in each row (first_fit_decreasing over windows of {PACK_WINDOW}, run {seen}); "
                f"the model then reads {key}_segment_ids and {key}_positions{refused}",
                ("data.sequence.mode=pack",)))
    if mode.shorter_length_helps:
        shorter = -(-max(lengths) // 128) * 128
        if shorter < length:
            findings.append(Finding(
                f"the longest example seen has {max(lengths)} tokens of {length}: length {shorter} would make "
                f"{pad_fraction(lengths, shorter):.0%} of the slots tokens in pad mode (longer examples would be "
                "cut or refused, data.sequence.overflow)",
                (f"data.sequence.length={shorter}",)))
    if mode.wider_window_helps and sequence.window < PACK_WINDOW:
        wider = pack_fraction(lengths, length, PACK_WINDOW, sequence.algorithm)
        if wider >= fraction + WINDOW_GAIN:
            findings.append(Finding(
                f"window: {sequence.window} packs {fraction:.1%} of each row with tokens; window: {PACK_WINDOW} would "
                f"pack ~{wider:.1%} ({sequence.algorithm}, run {seen}; a resume replays at most one window)",
                (f"data.sequence.window={PACK_WINDOW}",)))
    ordered = sorted(lengths)
    placement = placement_line() if mode.places_rows else ""
    return SequenceReport(key, sequence.mode, length, sequence.window, len(lengths),
                          (ordered[0], ordered[-1], float(np.median(ordered))), fraction,
                          measured.non_padding_fraction if measured is not None else None,
                          measured.tokens_per_sec if measured is not None else 0.0, findings,
                          long_examples(config, key, length, sample), placement)


def placement_line() -> str:
    """How this TensorFlow places packed rows: the cost per item differs by build (docs/sequences.md)."""
    if xla_on_cpu():
        return f"rows placed by a loop XLA compiles (TensorFlow {tf.__version__})"
    return (f"rows placed on TensorFlow's executor: TensorFlow {tf.__version__} has no XLA for the CPU (the TPU "
            "build); equal sizes are placed together, so windows of many short examples cost least")


