"""Which source each position of a mixture draws from: a pure function of (data.seed, position): its schedule.

Positions come in blocks of `BLOCK`. Every block holds exactly `quota[i]` positions of source i
(the weights apportioned to the block by largest remainder), in an order drawn per block from the
seed tree (`seeds.MIX`, no input pipeline in it). So:

- every host and every rerun agrees on the choice at every position;
- the delivered example shares never drift from the weights by more than one block's quota at any
  prefix (stratified, not independent draws: `tf.data.Dataset.sample_from_datasets` draws each
  choice independently, so its shares wander by ~sqrt(n) examples);
- how many of the first m positions chose source i has a closed form, `(m // BLOCK) * quota[i]` plus
  a count in block `m // BLOCK`: a resume finds every source's own position from one block's draw,
  never replaying the stream. That is what makes a mixture's saved state a few integers.

Sources that end (`exhausted: drop | stop`) are handled by `MixturePositions`: a dropped source's
later choices are passed over (which renormalizes the others' weights: their order is untouched),
a `stop` source's first choice past its end ends the mixture.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.core import seeds

BLOCK = 4096  # positions per block: the shares' resolution (1/4096) and the most a share is ever off by


def block_quotas(weights: Sequence[float], block: int = BLOCK, where: str = "data.mixture") -> np.ndarray:
    """`block` positions apportioned to `weights` by largest remainder; every positive weight gets at least one."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or len(w) == 0 or np.any(~np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ConfigError(f"{where}: weights must be finite, non-negative and not all zero; got {list(weights)}")
    exact = w / w.sum() * block
    quotas = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - quotas), kind="stable")
    quotas[order[: block - int(quotas.sum())]] += 1
    starved = (w > 0) & (quotas == 0)
    if starved.any():
        raise ConfigError(f"{where}: a weight below 1/{block} of the total cannot be met (source "
                          f"{int(np.argmax(starved))}); raise it or leave the source out")
    return quotas


@dataclasses.dataclass(frozen=True)
class MixingSchedule:
    """The choice at every position: block b is a seeded permutation of `quotas` (i repeated quota[i] times)."""

    weights: tuple[float, ...]
    seed: int = 0
    block: int = BLOCK

    @functools.cached_property
    def quotas(self) -> np.ndarray:
        return block_quotas(self.weights, self.block)

    @property
    def num_sources(self) -> int:
        return len(self.weights)

    def _block_tensor(self, index: tf.Tensor) -> tf.Tensor:
        """int64[block]: the source of each position of block `index` (graph or eager)."""
        base = tf.constant(np.repeat(np.arange(self.num_sources), self.quotas), tf.int64)
        noise = tf.random.stateless_uniform([self.block], seed=seeds.key(self.seed, seeds.MIX, None, index))
        return tf.gather(base, tf.argsort(noise, stable=True))

    @functools.lru_cache(maxsize=64)
    def block_choices(self, index: int) -> np.ndarray:
        """The source of each position of block `index`, as numpy (what `choices` yields there)."""
        return self._block_tensor(tf.constant(index, tf.int64)).numpy()

    def counts(self, position: int) -> np.ndarray:
        """How many of positions [0, position) chose each source."""
        full, part = divmod(int(position), self.block)
        counts = self.quotas * full
        if part:
            counts = counts + np.bincount(self.block_choices(full)[:part], minlength=self.num_sources)
        return counts

    def position_of(self, source: int, k: int) -> int:
        """The position of source `source`'s k-th choice (k from 1)."""
        quota = int(self.quotas[source])
        full, within = divmod(k - 1, quota)
        where = np.flatnonzero(self.block_choices(full) == source)[within]
        return full * self.block + int(where)

    def choices(self, start: int = 0) -> tf.data.Dataset:
        """The source (int64) of positions start, start+1, ...: the choice dataset of a mixture."""
        first, skip = divmod(int(start), self.block)
        blocks = tf.data.Dataset.range(first, (1 << 62) // self.block).map(self._block_tensor)
        return blocks.unbatch().skip(skip)


@dataclasses.dataclass(frozen=True)
class MixturePositions:
    """Where a mixture of sources that may end stands after `n` delivered examples.

    `totals[i]`: examples source i holds for this input pipeline before it ends (None: it never
    ends, `exhausted: repeat`); `stops[i]`: its end ends the mixture (`stop`) rather than leaving it
    (`drop`). Dropped sources' choices past their end are passed over, so the choice position runs
    ahead of the delivered count; both are closed-form functions of the schedule.
    """

    schedule: MixingSchedule
    totals: tuple[Optional[int], ...]
    stops: tuple[bool, ...]

    def taken(self, position: int) -> np.ndarray:
        """Examples each source delivered once the choices [0, position) are consumed."""
        counts = self.schedule.counts(position)
        return np.array([c if t is None else min(c, t) for c, t in zip(counts, self.totals)], np.int64)

    @functools.cached_property
    def end(self) -> Optional[int]:
        """The choice position that ends the mixture: the first `stop` source's first choice past its
        end, or None (it never ends through a stop). A source with weight 0 is never chosen."""
        ends = [self.schedule.position_of(i, total + 1) for i, (total, stop) in enumerate(zip(self.totals, self.stops))
                if stop and total is not None and self.schedule.quotas[i] > 0]
        return min(ends) if ends else None

    @functools.cached_property
    def length(self) -> Optional[int]:
        """Examples the mixture delivers in all (None: endless)."""
        if self.end is not None:
            return int(self.taken(self.end).sum())
        live = [total for total, quota in zip(self.totals, self.schedule.quotas) if quota > 0]
        if all(total is not None for total in live):
            return int(sum(live))
        return None

    def locate(self, delivered: int) -> int:
        """The choice position after `delivered` examples: the smallest m whose choices deliver them
        (a stream restarted there goes on exactly). Past the mixture's end: its end."""
        if self.length is not None and delivered >= self.length:
            return self.end if self.end is not None else self._search(self.length)
        return self._search(delivered)

    def _search(self, delivered: int) -> int:
        low, high = 0, max(1, delivered)
        while int(self.taken(high).sum()) < delivered:
            low, high = high, high * 2
        while low < high:
            middle = (low + high) // 2
            if int(self.taken(middle).sum()) >= delivered:
                high = middle
            else:
                low = middle + 1
        return low
