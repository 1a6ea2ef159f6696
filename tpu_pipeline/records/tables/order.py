"""Which rows of a Parquet/Arrow dataset each output split holds, and in what order they are written.

Order (`shuffle`, the default): the pieces (row groups) of a split are put in a seeded random order and
grouped into *windows* of consecutive pieces holding about `window_mb` of the columns converted; within
a window the rows are shuffled together (seeded by the seed, the split and the window's number). So a
shard mixes rows of many row groups, the converter holds about two windows and one piece per worker in
memory (never the dataset), and the row at position i is a pure function of a few integers: a resumed
conversion starts at a shard's first position by reading only the window that holds it. Without
`shuffle` the rows are written in file order.

A split cut by fractions (`--splits train=0.9,validation=0.1` of a layout of one split) takes its share
of every piece: a seeded choice of the piece's rows, the rounding carried from piece to piece so that
the totals are exact. Each split draws from the whole dataset, and each reads the files once.
"""
from __future__ import annotations

import bisect
import math
import zlib
from typing import Optional, Union

import numpy as np

from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.records.sharding import parse_splits, split_fractions
from tpu_pipeline.records.tables.files import TableFiles


def seed_of(*parts: Union[int, str]) -> list[int]:
    return [zlib.crc32(p.encode()) if isinstance(p, str) else int(p) for p in parts]


def _share(fraction: float, rows: int) -> int:
    """How many of the first `rows` rows fall below `fraction` of a cut (rounded, so totals are exact)."""
    return int(math.floor(fraction * rows + 0.5))


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


class SplitOrder:
    """Output split → its layout split and [low, high) share; its pieces, windows and rows."""

    def __init__(self, files: TableFiles, splits: Optional[str], seed: int, shuffle: bool, window_mb: float) -> None:
        self.files, self.seed, self.shuffle, self.window_mb = files, seed, shuffle, window_mb
        layout = files.layout.splits
        self.fractions: Optional[dict[str, float]] = None
        self.chosen: dict[str, tuple[str, float, float]] = {}
        if not splits:
            self.chosen = {name: (name, 0.0, 1.0) for name in layout}
        else:
            parsed = parse_splits(splits)
            numeric = any(v is not None and _is_number(v) for _, v in parsed)
            if numeric or (len(parsed) == 1 and parsed[0][1] is None and len(layout) == 1):
                if len(layout) != 1:
                    raise ConfigError(f"--splits {splits}: fractions cut a dataset of one split, and {files.layout.root} "
                                      f"has {len(layout)} ({', '.join(layout)}); pick or rename them instead, e.g. "
                                      "--splits train,validation=test")
                self.fractions = split_fractions(splits)
                source, low = next(iter(layout)), 0.0
                for name, fraction in self.fractions.items():
                    self.chosen[name] = (source, low, low + fraction)
                    low += fraction
                last = next(reversed(self.chosen))
                self.chosen[last] = (source, self.chosen[last][1], 1.0)
            else:
                for name, value in parsed:
                    source = value or name
                    if source not in layout:
                        raise ConfigError(f"--splits: {files.layout.root} has no split {source!r}; its splits: "
                                          f"{', '.join(layout)}")
                    self.chosen[name] = (source, 0.0, 1.0)
        self.pieces: dict[str, list[tuple[int, int, int]]] = {}  # split → (file, piece, rows in this split)
        for name, (source, low, high) in self.chosen.items():
            pieces, offset = [], 0
            for relative in layout[source]:
                number = files.index[relative]
                for piece, (rows, _, _) in enumerate(files[number].pieces):
                    count = ((_share(high, offset + rows) - _share(low, offset + rows))
                             - (_share(high, offset) - _share(low, offset)))
                    offset += rows
                    if count:
                        pieces.append((number, piece, count))
            if not pieces:
                raise DataError(f"--splits: split {name!r} gets no row out of {offset}; give it a larger fraction "
                                "or convert more data")
            self.pieces[name] = pieces
        self._windows: dict[str, tuple[list[list[int]], list[int]]] = {}

    def sizes(self) -> dict[str, int]:
        return {name: sum(p[2] for p in pieces) for name, pieces in self.pieces.items()}

    def windows(self, split: str) -> tuple[list[list[int]], list[int]]:
        """The split's windows (indices into its pieces, in write order) and each one's first position."""
        if split in self._windows:
            return self._windows[split]
        pieces = self.pieces[split]
        order = np.arange(len(pieces))
        if self.shuffle:
            order = np.random.default_rng(seed_of(self.seed, split, "pieces")).permutation(len(pieces))
        sizes = [self.files[pieces[i][0]].pieces[pieces[i][1]][1] for i in order.tolist()]
        mean = max(1.0, sum(sizes) / max(1, len(sizes)))
        per_window = max(1, int(self.window_mb * 2**20 // mean)) if self.shuffle else 1
        windows = [order[k:k + per_window].tolist() for k in range(0, len(order), per_window)]
        starts, position = [], 0
        for window in windows:
            starts.append(position)
            position += sum(pieces[i][2] for i in window)
        self._windows[split] = (windows, starts)
        return windows, starts

    def window_of(self, split: str, position: int) -> int:
        return max(0, bisect.bisect_right(self.windows(split)[1], position) - 1)

    def window_order(self, split: str, window: int, count: int) -> Union[list[int], range]:
        """The order of a window's `count` rows (those of its pieces, one piece after another)."""
        if not self.shuffle:
            return range(count)
        return np.random.default_rng(seed_of(self.seed, split, "window", window)).permutation(count).tolist()

    def rows(self, split: str, file: int, piece: int) -> Optional[np.ndarray]:
        """The rows of a piece that belong to `split` (None: all, in order)."""
        source, low, high = self.chosen[split]
        if low == 0.0 and high == 1.0:
            return None
        rows, _, first = self.files[file].pieces[piece]
        # The piece's rows in a seeded order; each split of the cut takes its consecutive share of it.
        order = (np.random.default_rng(seed_of(self.seed, self.files[file].relative, piece, "cut")).permutation(rows)
                 if self.shuffle else np.arange(rows))
        offset = self._offset(source, file) + first
        return order[_share(low, offset + rows) - _share(low, offset):_share(high, offset + rows) - _share(high, offset)]

    def _offset(self, source: str, file: int) -> int:
        """Rows of the layout split `source` before `file`."""
        offset = 0
        for relative in self.files.layout.splits[source]:
            number = self.files.index[relative]
            if number == file:
                return offset
            offset += self.files[number].num_rows
        raise KeyError(file)
