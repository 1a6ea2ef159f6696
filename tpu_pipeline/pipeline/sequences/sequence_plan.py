"""What the plan's `sequence` decision holds (`SequencePlan`), and the measured knobs the modes plan
with: window sizes, row-shuffle pools, parse blocks.

The modes themselves (tpu_pipeline.pipeline.sequences.modes) make the decision: `registry.plan_sequence`,
called once by `make_plan`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.pipeline.sources.base import Source

FilesBytes = Callable[[tuple[str, ...], int], Optional[int]]  # the files' total size, None past the limit

# data.sequence.window=auto. Measured with benchmarks/bench_packing.py (docs/sequences.md):
# first-fit-decreasing packs denser as windows grow, at a cost per item that grows slowly up to ~1-2k
# items (each placement searches all the window's rows) and a replay on resume of at most one pool.
# A pack window holds items of at most `length` tokens (chunks), so its tokens are bounded by
# window × length: auto keeps that at PACK_WINDOW_TOKENS (1024 items up to length 1024, fewer, at
# least PACK_WINDOW_MIN, for longer rows).
PACK_WINDOW = 1024
PACK_WINDOW_MIN = 256
PACK_WINDOW_TOKENS = 1 << 20
# data.sequence.row_shuffle=auto: the rows of consecutive windows adding up to ~2M tokens are permuted
# together (at length 256: 8 windows, 8192 rows), so a document of a few hundred rows still spreads
# over many batches (benchmarks/bench_row_shuffle.py); off when data.shuffle is off (evaluation).
ROW_SHUFFLE_TOKENS = 1 << 21
ROW_SHUFFLE_MAX_WINDOWS = 16
BUCKET_WINDOW_BATCHES = 32  # bucket mode: windows of 32 global batches, so each bucket's padded last group is rare


@dataclasses.dataclass(frozen=True)
class SequencePlan:
    """What data.sequence asks for, with `auto` resolved."""

    mode: str  # pad | bucket | pack
    lengths: dict  # key -> length
    window: int  # items per window (bucket: examples; pack: chunks of at most length); 0 for pad
    overflow: str
    algorithm: str
    bucket_lengths: tuple = ()
    bucket_batch: str = "examples"
    row_shuffle: int = 0  # pack: windows whose rows are permuted together (0: rows in packing order)
    parse_block: int = 0  # pack, batched parse: records parsed together (sized by the mean record)
    sources: int = 0  # pack, a mixture: its sources, whose tokens and segments each row counts

    def __str__(self) -> str:
        window = f", window {self.window}" if self.window else ""
        shuffle = f", rows shuffled {self.row_shuffle} windows at a time" if self.row_shuffle else ""
        return f"{self.mode} to {max(self.lengths.values())}{window}{shuffle}"


def auto_pack_window(length: int) -> int:
    """data.sequence.window=auto in pack mode: items (chunks of at most `length` tokens) per window."""
    return max(PACK_WINDOW_MIN, min(PACK_WINDOW, PACK_WINDOW_TOKENS // length))


# Pack mode parses records in blocks (one ragged batch), then cuts them into chunks. A block of a
# fixed number of records holds that many times the longest document (256 copies of one 30 MB
# document, repeated, took 8 GB): blocks are sized to ~PACK_PARSE_BYTES of serialized records by the
# dataset's mean record, from its files' sizes and metadata.json's count (no record read).
PACK_PARSE_BLOCK = 4096  # at most, records of a few bytes: the per-block op costs amortized
PACK_PARSE_BYTES = 8 << 20


def parse_block(source: Source, files: tuple[str, ...], files_bytes: FilesBytes) -> tuple[int, str]:
    """(records per parse block, why) for pack mode."""
    count = source.info().num_examples if files else None
    size = files_bytes(files, 1 << 62) if count else None
    if not count or not size:
        return PACK_PARSE_BLOCK, f"records parsed {PACK_PARSE_BLOCK} at a time"
    mean = max(1, size // count)
    block = max(1, min(PACK_PARSE_BLOCK, PACK_PARSE_BYTES // mean))
    return block, (f"records parsed {block} at a time (~{PACK_PARSE_BYTES >> 20} MB of records of "
                   f"{mean / 1024:,.0f} KB on average)")


def row_shuffle(config: DataConfig, window_tokens: int, prefix: str) -> tuple[int, str]:
    """(windows per row pool, why) for pack mode."""
    requested = config.sequence.row_shuffle
    key = f"{prefix}.sequence.row_shuffle"
    if requested is False:
        return 0, f"{key}=false: rows in packing order"
    if requested == "auto":
        if not config.shuffle.enabled:
            return 0, f"rows in packing order ({prefix}.shuffle is off)"
        windows = max(1, min(ROW_SHUFFLE_MAX_WINDOWS, ROW_SHUFFLE_TOKENS // window_tokens))
        return windows, f"rows shuffled {windows} window(s) at a time (auto: ~{ROW_SHUFFLE_TOKENS >> 20}M tokens)"
    windows = 1 if requested is True else int(requested)
    return windows, f"rows shuffled {windows} window(s) at a time ({key})"


def default_boundaries(length: int) -> list[int]:
    """length, length/2, length/4, length/8 (each a whole number), shortest first."""
    bounds = sorted({max(1, length >> shift) for shift in range(4)})
    return bounds
