"""`diagnose(config)`: why is this input pipeline as fast as it is, and what would make it faster?

It measures, on this machine and in one run:
  * each stage alone on one thread over records held in memory — batch, parse, then every op —
    as cumulative prefixes (the cost of a stage is its prefix's time minus the previous one's);
  * the two ceilings (tpu_pipeline.bench.ceilings) and the pipeline as configured;
then names the bottleneck, lists findings with the config change that fixes each, and measures
the tuned config side by side, so a proposal is only made with its measured effect.

For a data.sequence pipeline it also reports how much of each batch is tokens, and what would
raise it (`sequence_advice.sequence_report`): advice, kept out of the tuned config.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import tensorflow as tf

from tpu_pipeline.bench.augment_advice import augmentation_advice
from tpu_pipeline.bench.ceilings import (
    Ceilings, InMemoryElements, InMemoryRecords, in_memory_config, measure_ceilings, records_in_memory,
    single_thread_options,
)
from tpu_pipeline.bench.finding import Finding
from tpu_pipeline.bench.measure import (
    Measurement, Meter, aggregate, available_cores, describe, measure, measure_for, measure_to_a_new_window,
    summarize,
)
from tpu_pipeline.bench.sequence_advice import SequenceReport, sequence_report
from tpu_pipeline.config.base import validate
from tpu_pipeline.config.data import DataConfig, ServiceConfig, TFRecordSourceConfig
from tpu_pipeline.config.loader import apply_overrides
from tpu_pipeline.ops import get_op
from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.pipeline.mixtures.share_meter import mixture_counts, shares_line, with_source_meter
from tpu_pipeline.pipeline.plan import Plan


NOISE_SHARE = 0.01  # stages below 1% of the per-example work are within measurement noise


@dataclasses.dataclass(frozen=True)
class StageCost:
    name: str
    seconds_per_example: float  # one thread

    @property
    def examples_per_sec(self) -> float:
        return 1.0 / self.seconds_per_example if self.seconds_per_example > 0 else float("inf")


HEADROOM = 2.0  # the input delivers at least this many times what the model consumes: nothing to tune


@dataclasses.dataclass(frozen=True)
class ModelRate:
    """The config's model's training rate on this host with free input (`train.step_rate`), to compare
    with the input pipeline's: both in global batches (steps) per second."""

    steps_per_sec: float
    steps: int  # timed
    seconds: float
    warmup_seconds: float  # tracing and compilation, not timed
    device: str  # e.g. "cpu, 1 replica(s)"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def model_verdict(pipeline: Measurement, model: ModelRate) -> tuple[float, list[str]]:
    """(input batches/s ÷ model steps/s, the lines that say what it means for tuning)."""
    ratio = pipeline.batches_per_sec / model.steps_per_sec
    tokens = pipeline.real_tokens / pipeline.batches if pipeline.token_slots and pipeline.batches else None
    unit = (f" = {model.steps_per_sec * tokens:,.0f} tokens/s" if tokens is not None
            else f" = {model.steps_per_sec * pipeline.examples / max(pipeline.batches, 1):,.0f} examples/s")
    lines = [f"model: trains {model.steps_per_sec:,.2f} steps/s{unit} on this host ({model.device}; {model.steps} "
             f"step(s) timed after {model.warmup_seconds:.1f} s of tracing and compilation, on one batch of this "
             f"pipeline repeated from memory); the input pipeline delivers {pipeline.batches_per_sec:,.1f} batches/s"]
    if ratio >= HEADROOM:
        lines.append(f"verdict: the input pipeline delivers {ratio:,.1f}x what the model consumes on this host: "
                     "nothing to tune (the findings below would only matter for a model or accelerator that fast)")
    elif ratio >= 1:
        lines.append(f"verdict: the input pipeline delivers {ratio:,.2f}x what the model consumes: enough, with little "
                     "headroom; the findings below would add some")
    else:
        lines.append(f"verdict: the model could take {1 / ratio:,.1f}x what the input pipeline delivers: the input "
                     "sets the training speed; apply the findings below")
    return ratio, lines


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    cores: int
    plan: Plan
    pipeline: Measurement
    ceilings: Ceilings
    stages: list[StageCost]
    bottleneck: str
    findings: list[Finding]
    tuned: Optional[Measurement]
    sequence: Optional[SequenceReport] = None  # data.sequence pipelines: the non-padding fraction, advice
    warmup: int = 0  # batches before the pipeline's timed runs
    first_batch_seconds: Optional[float] = None  # the first of them, alone
    model: Optional[ModelRate] = None  # the config's model on this host (commands/doctor sets it)
    sources: Optional[dict[str, Any]] = None  # a mixture: the shares its timed batches held (line and counts)

    @property
    def fraction_of_limit(self) -> float:
        return self.pipeline.examples_per_sec / self.ceilings.limit

    @property
    def tuned_speedup(self) -> Optional[float]:
        return self.tuned.examples_per_sec / self.pipeline.examples_per_sec if self.tuned else None

    @property
    def withdrawn(self) -> bool:
        """The proposed changes measured slower than the configuration here: they are not proposed (the
        findings are still shown, with that figure)."""
        return self.tuned_speedup is not None and self.tuned_speedup < 1.0

    @property
    def tuned_overrides(self) -> list[str]:
        return [] if self.withdrawn else [o for finding in self.findings for o in finding.overrides]

    def as_dict(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "plan": self.plan.as_dict(),
            "pipeline": self.pipeline.as_dict(),
            "ceilings": self.ceilings.as_dict(),
            "fraction_of_limit": self.fraction_of_limit,
            "stages": [
                {"name": s.name, "seconds_per_example": s.seconds_per_example, "examples_per_sec_one_thread": s.examples_per_sec}
                for s in self.stages
            ],
            "bottleneck": self.bottleneck,
            "findings": [{"problem": f.problem, "overrides": list(f.overrides)} for f in self.findings],
            "tuned_overrides": self.tuned_overrides,
            "tuned": self.tuned.as_dict() if self.tuned else None,
            "tuned_speedup": self.tuned_speedup,
            "withdrawn": self.withdrawn,
            "sequence": self.sequence.as_dict() if self.sequence else None,
            "measured": describe(self.pipeline, self.warmup, self.first_batch_seconds),
            "sources": self.sources["counts"] if self.sources else None,
            "model": self.model.as_dict() if self.model else None,
            "input_to_model_ratio": model_verdict(self.pipeline, self.model)[0] if self.model else None,
        }

    def table(self) -> str:
        lines = ["plan (what the pipeline decided, and why):", self.plan.explain(), ""]
        lines.append(f"{'stage (one thread, records in memory)':44s} {'examples/s':>12s} {'us/example':>11s}")
        total = sum(s.seconds_per_example for s in self.stages)
        for stage in self.stages:
            if stage.seconds_per_example < NOISE_SHARE * total:
                lines.append(f"{stage.name:44s} {'(noise)':>12s} {'~0':>11s}")
            else:
                lines.append(f"{stage.name:44s} {stage.examples_per_sec:12,.0f} {stage.seconds_per_example * 1e6:11.1f}")
        c = self.ceilings
        lines += [
            "",
            f"ceiling (a) compute-bound: {c.compute_bound:,.0f} examples/s ({c.one_thread.examples_per_sec:,.0f} on one thread x {self.cores} cores)",
            f"ceiling (b) read-bound:    {c.read_bound:,.0f} examples/s (files read sequentially and batched, no parse"
            + ("" if c.reads_files_every_epoch else "; first epoch only: cached after it") + ")"
            if c.read_bound else "ceiling (b) read-bound:    n/a",
            f"pipeline as configured:    {self.pipeline.examples_per_sec:,.0f} examples/s = {self.fraction_of_limit:.2f} of the limit, "
            f"{self.pipeline.cores_used:.2f} cores, {self.pipeline.cpu_seconds_per_example * 1e6:.1f} us CPU/example",
            f"  measured: {describe(self.pipeline, self.warmup, self.first_batch_seconds)}",
            *([f"  {self.sources['line']} (weights in brackets)"] if self.sources else []),
        ]
        enough = False
        if self.model is not None:  # first: whether the input's own bottleneck matters at all
            ratio, said = model_verdict(self.pipeline, self.model)
            lines += said
            enough = ratio >= HEADROOM
        lines.append(f"bottleneck{' of the input pipeline' if self.model is not None else ''}: {self.bottleneck}")
        if self.withdrawn:
            lines.append(f"findings (withdrawn: their fixes together measured {self.tuned_speedup:.2f}x here, slower "
                         "than the configuration; nothing is proposed):")
        elif self.findings:
            lines.append("findings (not needed on this host, see the verdict):" if enough else "findings:")
        else:
            lines.append("findings: none: the configuration already runs at this machine's limit")
        for finding in self.findings:
            lines.append(f"  - {finding.problem}\n      fix: {' '.join(finding.overrides)}")
        if self.tuned:
            slower = ": slower, so not proposed" if self.withdrawn else ""
            lines.append(f"tuned pipeline:            {self.tuned.examples_per_sec:,.0f} examples/s "
                         f"({self.tuned_speedup:.2f}x, measured in this run{slower})")
        if self.sequence:
            lines += self.sequence.lines()
        return "\n".join(lines)


def _one_thread(dataset: tf.data.Dataset, seconds: float, repeats: int) -> Measurement:
    return summarize(measure_for(dataset.with_options(single_thread_options()), seconds, repeats=repeats))


def stage_costs(config: DataConfig, plan: Plan, records: InMemoryRecords, seconds: float = 0.4,
                repeats: int = 3) -> list[StageCost]:
    """Cost per example of batch, parse and each op, on one thread (cumulative prefixes)."""
    base = in_memory_config(config).model_copy(update={"outputs": None})
    raw = InMemoryElements(records.records)  # the same records as opaque strings: batched, never parsed
    once = " (once, cached)" if config.cache.enabled else ""
    ops = [(f"preprocess[{i}] {op.op}{once}", "preprocess", i) for i, op in enumerate(config.preprocess)]
    ops += [(f"augment[{i}] {op.op}", "augment", i) for i, op in enumerate(config.augment)]
    mode = plan.parse.value

    def prefix(count: int) -> DataConfig:  # data.sequence (pad, bucket or pack) is a stage of its own, last
        pre = config.preprocess[: min(count, len(config.preprocess))]
        aug = config.augment[: max(0, count - len(config.preprocess))]
        return base.model_copy(update={"preprocess": pre, "augment": aug, "sequence": None})

    def pipeline(prefix_config: DataConfig, source: Any) -> tf.data.Dataset:
        return Pipeline.from_config(prefix_config, source=source).build()

    def per_example(prefix_config: DataConfig, source: Any) -> float:
        return 1.0 / _one_thread(pipeline(prefix_config, source), seconds, repeats).examples_per_sec

    costs: list[StageCost] = []
    previous = per_example(prefix(0), raw)
    costs.append(StageCost("batch", previous))
    if mode != "none":
        current = per_example(prefix(0), records)
        costs.append(StageCost(f"parse ({mode}){once}", max(current - previous, 1e-9)))
        previous = current
    pending: list[str] = []  # ops timed together with the next: their outputs vary in shape
    for count, (name, _, _) in enumerate(ops, start=1):
        pending.append(name)
        try:
            current = per_example(prefix(count), records)
        except tf.errors.InvalidArgumentError:
            # Images of several sizes, decoded but not yet resized, cannot be batched to time the decode alone:
            # it is timed with the op after it. Where no op follows, the error is the pipeline's own.
            if count < len(ops) and not _static_per_example(pipeline(prefix(count), records)):
                continue
            raise
        costs.append(StageCost(" + ".join(pending), max(current - previous, 1e-9)))
        previous, pending = current, []
    if config.sequence is not None:
        current = per_example(prefix(len(ops)).model_copy(update={"sequence": config.sequence}), records)
        costs.append(StageCost(f"sequence ({plan.sequence.value})", max(current - previous, 1e-9)))
    return costs


def _static_per_example(dataset: tf.data.Dataset) -> bool:
    """Whether every example of a batched dataset has one shape (all but the batch dimension known)."""
    return all(spec.shape.rank is not None and spec.shape[1:].is_fully_defined()
               for spec in tf.nest.flatten(dataset.element_spec) if isinstance(spec, tf.TensorSpec))


def findings_for(config: DataConfig, plan: Plan, cores: int) -> list[Finding]:
    """Configuration problems that keep a pipeline from this machine's limit, each with its fix."""
    found: list[Finding] = []
    source = config.source
    batched = plan.parse.value == "batched"
    if isinstance(config.num_parallel_calls, int) and config.num_parallel_calls < cores:
        found.append(Finding(
            f"the preprocessing map runs {config.num_parallel_calls} call(s) at a time on {cores} cores",
            (f"data.num_parallel_calls={cores}",),
        ))
    if plan.parse.value == "per_example" and plan.ops_batchable and not config.cache.enabled:
        found.append(Finding(
            "records are parsed one at a time, though every op works on whole batches: batch first, then "
            "parse each batch with one parse_example call (one thread crossing per batch, not per record)",
            ("data.parse=batched",),
        ))
    if isinstance(source, TFRecordSourceConfig):
        if batched and plan.record_block.value == 0:
            found.append(Finding(
                "single records cross the parallel interleave one by one; move them in blocks",
                ("data.source.record_batch=256",),
            ))
        if batched and plan.shuffle.value == "stream":
            found.append(Finding(
                "records are shuffled one element at a time (~0.8 us each, as much as reading them); a window "
                "shuffle permutes a whole window of records with one gather",
                ("data.shuffle.mode=window",),
            ))
        if source.num_parallel_calls not in ("autotune", 0) and source.num_parallel_calls < 2:
            found.append(Finding("files are read by a single parallel reader", ("data.source.num_parallel_calls=autotune",)))
        remote = "://" in str(source.files or source.dir or "")
        found += _cycle_findings(config, plan, cores, remote)
        found += _record_cache_findings(config, plan)
        if remote and isinstance(source.buffer_size, int) and source.buffer_size < 1 << 20:
            found.append(Finding(
                f"read buffer of {source.buffer_size} bytes per remote file: small reads are latency-bound on GCS",
                ("data.source.buffer_size=auto",),
            ))
    if config.options.private_threadpool_size is None and config.options.max_intra_op_parallelism is None and not batched:
        found.append(Finding(
            "tf.data shares the process's threads with other work and lets one op use several threads: "
            f"a private pool of {cores} threads and one thread per op keep every core on whole examples",
            (f"data.options.private_threadpool_size={cores}", "data.options.max_intra_op_parallelism=1"),
        ))
    records_fit = any("data.cache.records=true" in f.overrides for f in found)
    if (not config.cache.enabled and config.preprocess and not records_fit and config.mixture is None
            and not any(get_op(o.op).random for o in config.preprocess)):  # (a mixture caches nothing)
        # The config refuses both caches at once: the record cache, measured to fit in memory, comes
        # first; the examples' cache (decoded, often many times larger) only where it was not proposed.
        found.append(Finding(
            "deterministic preprocessing is recomputed every epoch; if its output fits in memory, cache it",
            ("data.cache.enabled=true",),
        ))
    return found


def _record_cache_findings(config: DataConfig, plan: Plan) -> list[Finding]:
    """Files read again every epoch though they would fit in memory (beyond data.cache.records=auto's budget)."""
    if plan.record_cache.value or plan.data_bytes is None:
        return []  # cached, or not measured: one pass, examples cached, compressed, or over 1/4 of memory
    return [Finding(
        f"every epoch reads the {plan.data_bytes / 2**20:,.0f} MiB of record files again (~55 us of CPU per 100 KB "
        "record here: copy, CRC, allocation); they fit in memory",
        ("data.cache.records=true",),
    )]


FULL_CYCLE = 16  # files read at once (the default): for remote storage, enough reads in flight to hide latency


def _cycle_findings(config: DataConfig, plan: Plan, cores: int, remote: bool) -> list[Finding]:
    """The interleave's cycle length: how many files are read at the same time."""
    cycle = config.source.cycle_length
    if remote and (cycle == "autotune" or cycle < FULL_CYCLE):
        what = "autotune (about one file per core)" if cycle == "autotune" else str(cycle)
        return [Finding(
            f"cycle_length={what} reads that many remote files at a time; each read waits on storage latency, "
            f"so keep {FULL_CYCLE} reads in flight",
            (f"data.source.cycle_length={FULL_CYCLE}",),
        )]
    if not remote and cycle != "autotune" and cycle < cores:
        files = len(plan.files.value)
        if files > cycle:
            wanted = min(files, FULL_CYCLE)
            return [Finding(
                f"cycle_length={cycle}: {cycle} of {files} files read at a time, by as many reader threads, "
                f"on {cores} cores; the interleave cannot keep the cores fed when reading is the slow part",
                (f"data.source.cycle_length={wanted}",),
            )]
    return []


WARMUP = 5  # batches before the pipeline's timed runs
WINDOW_SECONDS = 30.0  # pack, bucket: time more batches, up to this, until they bring a new window
MEASURED_GAIN = 1.1  # a proposal that speeds the pipeline up by 10% or more, measured, is the bottleneck


def _name_bottleneck(stages: list[StageCost], ceilings: Ceilings, fraction: float, findings: list[Finding],
                     speedup: Optional[float]) -> str:
    work = [s for s in stages if s.name != "batch" and "(once, cached)" not in s.name] or stages
    worst = max(work, key=lambda s: s.seconds_per_example)
    share = worst.seconds_per_example / sum(s.seconds_per_example for s in stages)
    costliest = f"costliest stage: {worst.name}, {share:.0%} of the per-example work"
    advice = augmentation_advice(worst.name)
    costliest += f". {advice[0].upper()}{advice[1:]}" if advice else ""
    if findings and speedup is not None and speedup >= MEASURED_GAIN:
        return f"configuration: {findings[0].problem} (the fixes below measured {speedup:.2f}x; {costliest})"
    bound = "read-bound (storage)" if ceilings.limit < ceilings.compute_bound else "compute-bound"
    if fraction >= 0.9:
        return f"at the limit ({bound}); {costliest}"
    return f"{worst.name}: the pipeline reaches {fraction:.0%} of the limit ({costliest})"


AT_LIMIT = 0.9  # the pipeline runs at >= 90% of this host's compute-bound ceiling
HIGH_INPUT_WAIT = 0.1  # training waited for input >= 10% of its step time


def service_advice(diagnosis: "Diagnosis", training: Optional[dict[str, Any]] = None) -> Optional[str]:
    """When tf.data service workers would help, and how many cores they need; None when they would not.

    They help when this host's CPUs are the limit (the pipeline at its compute-bound ceiling) and
    training waits for input (`training`: a finished run's metrics.json). Tuning cannot help then;
    more cores can. Without training metrics it says what to look for.
    """
    ceilings = diagnosis.ceilings
    per_core = ceilings.one_thread.examples_per_sec
    compute_bound = ceilings.limit >= ceilings.compute_bound
    if not compute_bound or diagnosis.pipeline.examples_per_sec < AT_LIMIT * ceilings.limit:
        return None
    rate = f"{per_core:,.0f} examples/s per core"
    if training is None or training.get("input_wait_fraction") is None:
        return (f"this host's {diagnosis.cores} cores are the limit ({rate}); if training waits for input "
                "(input_wait_fraction in its metrics.json), tf.data service workers add cores: "
                "docs/service.md")
    wait = float(training["input_wait_fraction"])
    if wait < HIGH_INPUT_WAIT:
        return None
    consumed = float(training.get("examples_per_sec") or 0.0)
    need = consumed / max(1e-6, 1.0 - wait)  # what the accelerator would take if it never waited
    cores = max(1, math.ceil(need / per_core - 1e-6))
    return (f"training waited for input {wait:.0%} of its step time while this host's pipeline runs at its CPU limit "
            f"({rate}): use tf.data service workers. The accelerator would take about {need:,.0f} examples/s, "
            f"which needs about {cores} worker cores at {rate} (plus headroom): docs/service.md")


def diagnose(
    config: DataConfig, cores: Optional[int] = None, batches: int = 20, repeats: int = 3, records: int = 512,
    measure_tuned: bool = True,
) -> Diagnosis:
    """Measures stages, ceilings, the pipeline, and (optionally) the tuned pipeline, in one run."""
    cores = cores or available_cores()
    # This host's own pipeline: data.service would move the work, and the measurement, elsewhere.
    config = config.model_copy(update={"repeat": "forever", "service": ServiceConfig()})
    planned = Pipeline.from_config(config)
    memory = records_in_memory(config, records)
    stages = stage_costs(config, planned.plan, memory, repeats=repeats)
    ceilings = measure_ceilings(config, cores, records=records, repeats=repeats)
    # Measured as demo and bench measure (bench.measure): all timed batches together, new windows counted.
    metered, by_source = with_source_meter(planned)  # a mixture: the shares its batches hold
    meter = Meter(metered.build(with_position=planned.windowed is not None))
    runs = measure(None, batches, warmup=WARMUP, repeats=repeats, meter=meter)
    sources = None
    if by_source is not None:
        sources = {"line": shares_line(config.mixture, *by_source.totals()),
                   "counts": mixture_counts(config.mixture, *by_source.totals())}
    pipeline = aggregate(measure_to_a_new_window(meter, runs, WINDOW_SECONDS))
    findings = findings_for(config, planned.plan, cores)
    tuned = None
    if measure_tuned and findings:
        tuned_pipeline = Pipeline.from_config(tune(config, [o for f in findings for o in f.overrides]))
        tuned = aggregate(measure(None, batches, warmup=WARMUP, repeats=repeats,
                                  meter=Meter(tuned_pipeline.build(with_position=tuned_pipeline.windowed is not None))))
    fraction = pipeline.examples_per_sec / ceilings.limit
    speedup = tuned.examples_per_sec / pipeline.examples_per_sec if tuned else None
    bottleneck = _name_bottleneck(stages, ceilings, fraction, findings, speedup)
    sequence = sequence_report(config, planned.plan, pipeline)
    return Diagnosis(cores, planned.plan, pipeline, ceilings, stages, bottleneck, findings, tuned, sequence,
                     warmup=WARMUP, first_batch_seconds=meter.first_batch_seconds, sources=sources)


def tune(config: DataConfig, overrides: list[str]) -> DataConfig:
    """The config with `data.*` overrides applied (validated like a config file)."""
    raw = {"data": config.model_dump(mode="python")}
    return validate(DataConfig, apply_overrides(raw, overrides)["data"], prefix="data")
