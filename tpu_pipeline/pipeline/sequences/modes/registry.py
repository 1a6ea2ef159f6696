"""The sequence modes, listed once: `sequence_mode(name)`, and `plan_sequence`, the plan's decision.

A new mode is one module in this folder with a `SequenceMode` subclass (`base.py`), and one line in `MODES`.
"""
from __future__ import annotations

from typing import Optional

from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.pipeline.sequences.modes.base import PlanRequest, SequenceMode
from tpu_pipeline.pipeline.sequences.modes.bucket import BucketMode
from tpu_pipeline.pipeline.sequences.modes.pack import PackMode
from tpu_pipeline.pipeline.sequences.modes.pad import PadMode
from tpu_pipeline.pipeline.sequences.sequence_plan import FilesBytes, SequencePlan
from tpu_pipeline.pipeline.sources.base import Source

MODES: dict[str, SequenceMode] = {mode.name: mode for mode in (PadMode(), BucketMode(), PackMode())}


def sequence_mode(name: str) -> SequenceMode:
    """The mode object of a `data.sequence.mode` name (the config validated it)."""
    return MODES[name]


def plan_sequence(config: DataConfig, prefix: str, source: Source, files: tuple[str, ...],
                  files_bytes: FilesBytes) -> tuple[Optional[SequencePlan], str]:
    """The plan's `sequence` decision: (what data.sequence asks for with `auto` resolved, or None; why).
    `files_bytes(files, limit)`: the plan's measure of the files' size, for pack's parse block."""
    if config.sequence is None:
        return None, "no data.sequence: every feature has a static shape"
    request = PlanRequest(config, prefix, source, files, files_bytes)
    return sequence_mode(config.sequence.mode).plan(request)
