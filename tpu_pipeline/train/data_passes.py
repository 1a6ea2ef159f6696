"""How many passes over the training data one "epoch" of a fixed `train.steps_per_epoch` is, told when it is many.

Why: a config written for one data set (configs/chat_sft.yaml: 50 steps of 16 packed rows for the demo's 2,800
conversations) is reused for another with `data.source.dir=...`. On 270 short conversations its "epoch" is ~27
passes, and "training 2 epoch(s) of 50 steps" said nothing of it: the model saw each answer ~54 times. So when an
epoch of the given steps holds two passes or more, one line says how many and which `train.steps_per_epoch` is
one pass. Under one pass (a long pretraining run logged every N steps) nothing is said.

A pass is counted from the data set's metadata.json: its examples, or for packed rows its tokens over the row
length (about: packing fills ~98% of a row, `lm_shift` takes a token a document). A mixture has shares of its own
(`data.mixture`), data without a count (a bare glob of files) cannot tell: neither gets a line.
"""
from __future__ import annotations

from typing import Optional

from tpu_pipeline.config import Config
from tpu_pipeline.format.metadata import load_dataset_dir
from tpu_pipeline.model.schedules import warmup_note
from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.pipeline.sequences.modes.registry import sequence_mode
from tpu_pipeline.pipeline.sources.dataset_dir import DatasetDirSource

MANY = 2.0  # passes per epoch from which the line is printed


def rows_per_pass(config: Config, pipeline: Pipeline) -> Optional[tuple[float, str]]:
    """(rows a pass over the training data gives, what they are), or None where it cannot be told."""
    data = config.data
    if data is None or data.mixture is not None:
        return None
    sequence = data.sequence
    packed = sequence is not None and sequence_mode(sequence.mode).row_name
    if not packed:
        examples = pipeline.source.info().num_examples
        return (float(examples), "examples") if examples else None
    source = pipeline.source  # the split the pipeline reads, and the key its errors name
    if not isinstance(source, DatasetDirSource):
        return None
    _, entry = load_dataset_dir(source.dir, source.split, source.key)
    tokens = entry.get("num_tokens")
    return (tokens / sequence.length, f"{packed} of {sequence.length}") if tokens else None


def passes_note(config: Config, pipeline: Pipeline, steps: int) -> Optional[str]:
    """The line for an explicit `train.steps_per_epoch` whose epoch is `MANY` passes or more; else None."""
    if not config.train.steps_per_epoch:
        return None  # then an epoch is one pass
    found = rows_per_pass(config, pipeline)  # rows > 0 where found
    if found is None:
        return None
    rows, unit = found
    batch = config.data.batch_size
    passes = steps * batch / rows
    if passes < MANY:
        return None
    one = max(1, round(rows / batch))
    return (f"note: an epoch here is train.steps_per_epoch={steps} steps of {batch} {unit}, about {passes:,.0f} passes "
            f"over the training data (about {rows:,.0f} {unit.split(' of ')[0]} a pass); for one pass an epoch set "
            f"train.steps_per_epoch={one}")


def epoch_notes(config: Config, pipeline: Pipeline, steps: int, epochs: int) -> list[str]:
    """The lines `train` prints before it starts about its epochs: a warm-up that covered the whole run, shrunk
    (`model.schedules.warmup_note`), and an epoch of many passes over the data (`passes_note`)."""
    return [note for note in (warmup_note(config.model.schedule, steps, epochs), passes_note(config, pipeline, steps))
            if note]
