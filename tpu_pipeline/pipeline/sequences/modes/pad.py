"""Pad mode: each example padded (or cut) to `length`, a mask beside it; one op of the parsing map."""
from __future__ import annotations

from typing import Any, Callable

from tpu_pipeline.pipeline.sequences.fill_estimates import pad_fraction
from tpu_pipeline.pipeline.sequences.modes.base import PlanRequest, SequenceMode
from tpu_pipeline.pipeline.sequences.sequence_plan import SequencePlan
from tpu_pipeline.pipeline.sequences.sequence_stages import pad_batch, pad_example
from tpu_pipeline.pipeline.stages.batching import Batch


class PadMode(SequenceMode):
    name = "pad"
    shorter_length_helps = True

    def plan(self, request: PlanRequest) -> tuple[SequencePlan, str]:
        sequence = request.sequence
        return (SequencePlan("pad", sequence.lengths(), 0, sequence.resolved_overflow(), sequence.algorithm),
                f"{request.key}.mode=pad: each example padded to its length, a mask beside it; {request.cut()}")

    def ops(self, sequence: SequencePlan, batched: bool) -> tuple[list[Callable], list[bool]]:
        pad = pad_batch if batched else pad_example
        return [lambda features, seed=None: pad(features, sequence.lengths, sequence.overflow)], [False]

    def stages(self, sequence: SequencePlan, batch: Batch, num_parallel_calls: Any, batched: bool,
               seed: int) -> list[Any]:
        return [] if batched else [batch]  # batched: the records were batched before the parse

    def fraction(self, lengths: list[int], sequence: SequencePlan, batch_size: int, length: int) -> float:
        return pad_fraction(lengths, length)
