"""Pack mode: the stream cut into chunks of at most `length`, windows of chunks packed into rows
(segment ids and positions beside the tokens), rows shuffled in pools of windows; then the batch of rows."""
from __future__ import annotations

from typing import Any

from tpu_pipeline.pipeline.sequences.fill_estimates import pack_fraction
from tpu_pipeline.pipeline.sequences.modes.base import PlanRequest, SequenceMode
from tpu_pipeline.pipeline.sequences.sequence_plan import SequencePlan, auto_pack_window, parse_block, row_shuffle
from tpu_pipeline.pipeline.sequences.sequence_stages import PackRows
from tpu_pipeline.pipeline.stages.batching import Batch


class PackMode(SequenceMode):
    name = "pack"
    weights_key = "targets_segment_ids"
    row_name = "packed rows"
    windowed_output = "row"
    packs_denser = False
    places_rows = True
    wider_window_helps = True

    def plan(self, request: PlanRequest) -> tuple[SequencePlan, str]:
        sequence, key = request.sequence, request.key
        longest = sequence.max_length
        auto = sequence.window == "auto"
        window = auto_pack_window(longest) if auto else int(sequence.window)
        pools, shuffle_why = row_shuffle(request.config, window * longest, request.prefix)
        tokens = window * longest * max(1, pools)
        block, block_why = parse_block(request.source, request.files, request.files_bytes)
        return (SequencePlan("pack", sequence.lengths(), window, sequence.resolved_overflow(), sequence.algorithm,
                             row_shuffle=pools, parse_block=block,
                             sources=len(request.config.mixture.sources) if request.config.mixture else 0),
                f"{key}.mode=pack: {sequence.algorithm} over windows of {window} chunks of at most {longest} "
                f"tokens" + (" (auto: measured, docs/sequences.md)" if auto else "")
                + f"; {request.cut()}; {shuffle_why}; at most {tokens:,} tokens per key held at once; {block_why}")

    def deals_rows_on_another_slice(self) -> bool:
        return True

    def example_in_one_row(self, overflow: str) -> bool:
        return overflow in ("truncate", "error")  # split: a long example's pieces fill several rows

    def parse_block(self, sequence: SequencePlan) -> int:
        return sequence.parse_block  # blocks of records parsed as one ragged batch, then cut into chunks

    def stages(self, sequence: SequencePlan, batch: Batch, num_parallel_calls: Any, batched: bool,
               seed: int) -> list[Any]:
        return [PackRows(list(sequence.lengths), sequence.window, lengths=sequence.lengths,
                         algorithm=sequence.algorithm, overflow=sequence.overflow,
                         num_parallel_calls=num_parallel_calls, row_shuffle=sequence.row_shuffle, seed=seed,
                         sources=sequence.sources), batch]

    def fraction(self, lengths: list[int], sequence: SequencePlan, batch_size: int, length: int) -> float:
        return pack_fraction(lengths, length, sequence.window, sequence.algorithm)
