"""Bucket mode: examples grouped by length over a window, each batch padded to its bucket's length.

Every replica of a step gets the same shape, so with several input pipelines (hosts) each reads the
whole stream and keeps its own replicas' batches (`shares_stream`); exact evaluation counts its
batches by one pass and weighs by `example_mask`.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import tensorflow as tf

from tpu_pipeline.pipeline.sequences import carried_weights
from tpu_pipeline.pipeline.sequences.fill_estimates import bucket_fraction
from tpu_pipeline.pipeline.sequences.modes.base import PlanRequest, SequenceMode
from tpu_pipeline.pipeline.sequences.sequence_plan import BUCKET_WINDOW_BATCHES, SequencePlan, default_boundaries
from tpu_pipeline.pipeline.sequences.sequence_stages import Bucket, bucket_batches
from tpu_pipeline.pipeline.stages.batching import Batch
from tpu_pipeline.pipeline.stages.evaluation import bucketed_evaluation


def _cut_to_length(features: dict, seed: Any = None, *, lengths: dict, batched: bool) -> dict:
    """Each sequence key's first `length` tokens (of every example of a batch, when `batched`); lm_shift's folded
    targets as two keys first (a bucket's rows hold each)."""
    features = carried_weights.apart(features, list(lengths))
    cut = {key: features[key][:, :length] if batched else features[key][:length] for key, length in lengths.items()}
    return {**features, **cut}


class BucketMode(SequenceMode):
    name = "bucket"
    windowed_outputs_are_batches = True
    length_varies = True

    def plan(self, request: PlanRequest) -> tuple[SequencePlan, str]:
        sequence = request.sequence
        bounds = tuple(sequence.boundaries or default_boundaries(sequence.max_length))
        if bounds[-1] < sequence.max_length:
            bounds += (sequence.max_length,)
        auto = sequence.window == "auto"
        window = BUCKET_WINDOW_BATCHES * request.config.batch_size if auto else sequence.window
        return (SequencePlan("bucket", sequence.lengths(), int(window), sequence.resolved_overflow(),
                             sequence.algorithm, bounds, sequence.bucket_batch),
                f"{request.key}.mode=bucket: {len(bounds)} shapes ({', '.join(map(str, bounds))}), one per step; "
                f"windows of {window} examples" + (" (auto: 32 global batches)" if auto else "") + f"; {request.cut()}")

    def example_in_one_row(self, overflow: str) -> bool:
        return False  # a bucket's last batch is filled with padding examples

    def parse_block(self, sequence: SequencePlan) -> int:
        return sequence.window  # the window is the batch of records, parsed as one ragged batch

    def ops(self, sequence: SequencePlan, batched: bool) -> tuple[list[Callable], list[bool]]:
        """The cut to the length, before the window forms, so a window holds at most window × length
        tokens however long a document is (overflow: error is the bucket stage's, naming the example)."""
        if sequence.overflow != "truncate":
            return [], []
        return [functools.partial(_cut_to_length, lengths=sequence.lengths, batched=batched)], [False]

    def stages(self, sequence: SequencePlan, batch: Batch, num_parallel_calls: Any, batched: bool,
               seed: int) -> list[Any]:
        return [Bucket(list(sequence.lengths), sequence.window, lengths=sequence.lengths,
                       bucket_lengths=sequence.bucket_lengths, global_batch_size=batch.global_batch_size,
                       overflow=sequence.overflow, scale=sequence.bucket_batch)]

    def regroups_on_another_slice(self, bucket_batch: str) -> bool:
        # Every host reads the whole stream, so a window's buckets are the same on any slice.
        return True

    def groups_change_with_the_slice(self, bucket_batch: str) -> bool:
        # With batches of the same examples per bucket, each step's group is the same global batch's examples
        # of one bucket whatever the replicas: only its cut differs. Scaled by tokens, a bucket's batch rounds
        # per replica: its groups change with the replicas, so a resume counts the examples they covered.
        return bucket_batch != "examples"

    def shares_stream(self, context: tf.distribute.InputContext) -> bool:
        return context.num_input_pipelines > 1

    def evaluation(self, pipeline: Any) -> Any:
        return bucketed_evaluation(pipeline)

    def fraction(self, lengths: list[int], sequence: SequencePlan, batch_size: int, length: int) -> float:
        sizes = bucket_batches(list(sequence.bucket_lengths), batch_size, tf.distribute.InputContext(),
                               sequence.bucket_batch)
        return bucket_fraction(lengths, list(sequence.bucket_lengths), sizes, sequence.window)
