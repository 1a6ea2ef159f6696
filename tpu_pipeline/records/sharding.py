"""How many shards, which examples go in each, and which split each example belongs to.

Shards hold contiguous ranges of the (seeded, shuffled) example order, so every shard is a unit of
work that can be written, checked and skipped on its own when a conversion is resumed.
"""
from __future__ import annotations

import math
import re
from typing import Optional

import numpy as np

from tpu_pipeline.errors import ConfigError, DataError

_SPLIT_NAME = re.compile(r"^[A-Za-z0-9_]+$")
RECORD_OVERHEAD = 16  # bytes of TFRecord framing (length, two CRCs) per record


def parse_splits(text: str, flag: str = "--splits") -> list[tuple[str, Optional[str]]]:
    """'train=0.9,validation=0.1' or 'train,validation=test' → [(name, value or None), ...]."""
    parsed: list[tuple[str, Optional[str]]] = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        name, _, value = part.partition("=")
        name = name.strip()
        if not _SPLIT_NAME.match(name):
            raise ConfigError(f"{flag}: split name {name!r} may hold only letters, digits and '_' (it names the files)")
        if name in [n for n, _ in parsed]:
            raise ConfigError(f"{flag}: split {name!r} is named twice")
        parsed.append((name, value.strip() or None))
    if not parsed:
        raise ConfigError(f"{flag}: give at least one split name, e.g. train or train=0.9,validation=0.1")
    return parsed


def split_fractions(text: str, flag: str = "--splits") -> dict[str, float]:
    """Splits as fractions of one input: 'train' (all of it) or 'train=0.9,validation=0.1' (sum 1)."""
    parsed = parse_splits(text, flag)
    if len(parsed) == 1 and parsed[0][1] is None:
        return {parsed[0][0]: 1.0}
    fractions: dict[str, float] = {}
    for name, value in parsed:
        try:
            fraction = float(value) if value is not None else math.nan
        except ValueError:
            fraction = math.nan
        if not 0 < fraction <= 1:
            raise ConfigError(
                f"{flag}: split {name!r} needs a fraction in (0, 1], e.g. train=0.9,validation=0.1 (given: {value!r})"
            )
        fractions[name] = fraction
    total = sum(fractions.values())
    if abs(total - 1) > 1e-6:
        raise ConfigError(f"{flag}: the fractions add up to {total:g}; they must add up to 1, e.g. train=0.9,validation=0.1")
    return fractions


def assign_splits(num_items: int, fractions: dict[str, float], seed: int, shuffle: bool) -> dict[str, np.ndarray]:
    """Item indices per split, in the order they are written (a seeded permutation when `shuffle`).

    Shuffling here matters: an image folder lists one class after another, and shards of a single
    class would defeat the file interleave a TPU pipeline relies on to mix its examples.
    """
    order = np.random.default_rng(seed).permutation(num_items) if shuffle else np.arange(num_items)
    result: dict[str, np.ndarray] = {}
    start, cumulative = 0, 0.0
    names = list(fractions)
    for position, name in enumerate(names):
        cumulative += fractions[name]
        end = num_items if position == len(names) - 1 else int(round(cumulative * num_items))
        if end <= start:
            raise DataError(
                f"--splits: split {name!r} gets no example out of {num_items}; give it a larger fraction "
                "or convert more data"
            )
        result[name] = order[start:end]
        start = end
    return result


def num_shards_for(num_items: int, estimated_bytes: int, target_bytes: int, min_shards: int) -> int:
    """ceil(size / target), at least `min_shards`, at most one shard per example (no empty shards)."""
    wanted = max(min_shards, math.ceil(estimated_bytes / max(1, target_bytes)))
    return max(1, min(wanted, num_items))


def shard_bounds(num_items: int, num_shards: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges whose lengths differ by at most one."""
    return [(k * num_items // num_shards, (k + 1) * num_items // num_shards) for k in range(num_shards)]
