"""The order a balanced read yields its records in, computed at once instead of read.

`TFRecordSource.build` reads each file's run of records in blocks through `Dataset.interleave`
(cycle_length files at a time, block_length blocks from each in turn). A mixture over the record
cache needs only the indices of those records, in that order; reading them through the same
interleave costs a tf.data element per block (~50 µs, as much as copying the records), so here the
interleave's order is replayed in NumPy once per epoch: one vector of indices.

The replay follows tf.data's sequential `InterleaveDataset` (which a deterministic parallel interleave
matches): slots are visited in turn; an empty slot opens the next file and reads from it in the same
visit; a slot yields up to block_length blocks a visit; a file found at its end frees its slot and the
turn passes on. `tests/test_mixture_memory_read.py` checks it against the real interleave.
"""
from __future__ import annotations

import numpy as np


def interleave_blocks(blocks: np.ndarray, cycle_length: int, block_length: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(file, block within it) of every block, in the order an interleave of files holding `blocks[j]` blocks
    each yields them."""
    files, numbers = [], []
    slots: list[list[int] | None] = [None] * cycle_length
    cycle = turn = opened = 0
    while opened < len(blocks) or any(slot is not None for slot in slots):
        slot = slots[cycle]
        if slot is None:
            if opened < len(blocks):
                slots[cycle] = [opened, 0]
                opened += 1
                continue  # read from it in this same visit
            cycle, turn = (cycle + 1) % cycle_length, 0
            continue
        file, block = slot
        if block < blocks[file]:
            files.append(file)
            numbers.append(block)
            slot[1] += 1
            turn += 1
            if turn == block_length:
                cycle, turn = (cycle + 1) % cycle_length, 0
        else:  # at its end: the slot is freed and the turn passes on
            slots[cycle] = None
            cycle, turn = (cycle + 1) % cycle_length, 0
    return np.asarray(files, np.int64), np.asarray(numbers, np.int64)


def epoch_indices(firsts: np.ndarray, takes: np.ndarray, record_block: int, cycle_length: int,
                  block_length: int = 1) -> np.ndarray:
    """The indices of the records an interleaved read yields, in order: file j's run is records
    firsts[j] .. firsts[j] + takes[j] - 1, read in blocks of `record_block`."""
    firsts, takes = np.asarray(firsts, np.int64), np.asarray(takes, np.int64)
    files, numbers = interleave_blocks(-(-takes // record_block), cycle_length, block_length)
    begins = firsts[files] + numbers * record_block
    sizes = np.minimum(takes[files] - numbers * record_block, record_block)
    offsets = np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return np.repeat(begins, sizes) + offsets
