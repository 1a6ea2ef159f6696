"""The rest of an interrupted epoch, dealt to another number of input pipelines (a resume on another slice).

Why it can be exact with a few integers: every epoch of an input pipeline is a pure function of
(data.seed, epoch, pipeline index among P), and P pipelines in lockstep each stood at a known example of
their own stream. So what they had left of the epoch they were in is known, record for record:

    R = for t = 0, 1, ...: old pipeline 0's next record, old pipeline 1's next, ..., old pipeline P-1's

(round robin, up to the end of epoch E, the last epoch any of them had begun). New pipeline j of M reads
R[taken + j], R[taken + j + M], ...: every record once, the shares within one of each other. Then it goes
on with epoch E + 1 of its own layout: from there the stream is the one a run started on M pipelines has.

Pipelines consume in lockstep (one batch per step each), so after c examples each the delivered part of
R is its first M * c records: the state stays (the old places, `taken`) however often the layout changes
again before R is done. A pipeline whose share is one short starts epoch E + 1 one example early (the
remainder ends without a short step or filler, shapes stay static); once every share is done, each
pipeline's place is a plain position in its own stream again.

Positions here are a pipeline's stream positions: examples it delivered since the start of epoch 0.
"""
from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Remainder:
    """What P old input pipelines had left of the epoch they were in, and how much of it was delivered since.

    `examples[i]`: old pipeline i's stream position when it stopped; `length`: the epoch length of each
    old pipeline (balanced shards: the same for all); `taken`: records of R delivered since (dealing order)."""

    examples: tuple[int, ...]
    length: int
    taken: int = 0

    def __post_init__(self) -> None:
        if not self.examples or self.length <= 0:
            raise ValueError(f"a remainder needs old positions and an epoch length (got {self.examples}, {self.length})")

    @property
    def hosts(self) -> int:
        return len(self.examples)

    @property
    def epoch(self) -> int:
        """E: the last epoch any old pipeline had begun (-1 when none had begun one: nothing left over)."""
        return max(-(-example // self.length) for example in self.examples) - 1

    def left(self, index: int) -> int:
        """Records old pipeline `index` had left up to the end of epoch E."""
        return (self.epoch + 1) * self.length - self.examples[index]

    @property
    def total(self) -> int:
        """|R|: the records left by all old pipelines together."""
        return sum(self.left(index) for index in range(self.hosts))

    @property
    def rest(self) -> int:
        """Records of R not delivered yet."""
        return self.total - self.taken

    def share(self, pipelines: int, index: int) -> int:
        """Records of the rest that new pipeline `index` of `pipelines` reads."""
        return len(range(self.taken + index, self.total, pipelines))

    def start(self, pipelines: int, index: int, length: int) -> int:
        """New pipeline `index`'s stream position as it begins its share: (E + 1) * its epoch `length` minus
        the share, so that epoch E + 1 begins at its own place (and element seeds count on from there)."""
        return (self.epoch + 1) * length - self.share(pipelines, index)

    def after(self, pipelines: int, delivered: int) -> Optional["Remainder"]:
        """The remainder once each of `pipelines` new pipelines delivered `delivered` examples since it
        began its share; None when R is done (every pipeline is then in epoch E + 1 or later)."""
        taken = self.taken + pipelines * delivered
        return dataclasses.replace(self, taken=taken) if taken < self.total else None

    def to_json(self) -> dict:
        return {"examples": list(self.examples), "length": self.length, "taken": self.taken}

    def record_order(self) -> list[tuple[int, int]]:
        """R as (old pipeline, its stream position), in dealing order: what the dataset reads, for tests."""
        order, positions = [], list(self.examples)
        end = (self.epoch + 1) * self.length
        while any(position < end for position in positions):
            for index, position in enumerate(positions):
                if position < end:
                    order.append((index, position))
                    positions[index] += 1
        return order


class MixtureDealt:
    """What a mixture's remainder keeps beside the old places (`MixedRemainder`, `row_remainder.RowRemainder`): E_s of
    each source (`epochs`), and each old pipeline's saved mixture state (`states`: one for all where they agree)."""

    epochs: tuple[int, ...]
    states: tuple[str, ...]

    @property
    def first_epochs(self) -> tuple[int, ...]:
        """The epoch each source's own stream begins with on the new pipelines."""
        return tuple(epoch + 1 for epoch in self.epochs)

    def state(self, index: int) -> str:
        """Old pipeline `index`'s saved mixture state."""
        return self.states[index] if len(self.states) > 1 else self.states[0]


@dataclasses.dataclass(frozen=True)
class MixedRemainder(MixtureDealt, Remainder):
    """A mixture's remainder (`data.mixture`, whose sources each have epochs of their own): old pipeline i had
    `lefts[i]` examples left, its mixture (saved state `states[i]`, or `states[0]` for all) rebuilt from its
    place with each source s ending at the end of its epoch `epochs[s]` (E_s: the last one any old pipeline had
    begun). A new pipeline's own mixture then begins each source at epoch E_s + 1, at its own stream position 0:
    its place while it reads its share is minus what is left of the share. `length` is unused (1)."""

    lefts: tuple[int, ...] = ()
    epochs: tuple[int, ...] = ()
    states: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.examples or len(self.lefts) != len(self.examples) or not self.states:
            raise ValueError(f"a mixture's remainder needs each old place, its count left and a state (got "
                             f"{self.examples}, {self.lefts}, {len(self.states)} state(s))")

    @property
    def epoch(self) -> int:
        return max(self.epochs)

    def left(self, index: int) -> int:
        return self.lefts[index]

    def start(self, pipelines: int, index: int, length: int) -> int:
        return -self.share(pipelines, index)

    def to_json(self) -> dict:
        return {"examples": list(self.examples), "taken": self.taken, "lefts": list(self.lefts),
                "epochs": list(self.epochs), "states": list(self.states)}


def remainder_from_json(saved: Optional[dict]) -> Optional[Remainder]:
    """A layout's remainder as `to_json` wrote it (a mixture's has `lefts`)."""
    if saved is None:
        return None
    if "lefts" in saved:
        return MixedRemainder(tuple(saved["examples"]), 1, saved["taken"], tuple(saved["lefts"]),
                              tuple(saved["epochs"]), tuple(saved["states"]))
    return Remainder(tuple(saved["examples"]), saved["length"], saved["taken"])


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where every input pipeline of a run stands as of global step `step`: `examples[j]`, pipeline j's
    stream position, and the `remainder` of an older layout they are still dealing (None: none). What a
    checkpoint keeps of an example stream (a few integers per pipeline); `train` reads it back to build
    each pipeline's stream (`place`), and deals it to another number of pipelines (`dealt_to`)."""

    examples: tuple[int, ...]
    step: int = 0
    remainder: Optional[Remainder] = None

    @property
    def hosts(self) -> int:
        return len(self.examples)

    def place(self, index: int, step: int, per_step: int) -> tuple[int, Optional[Remainder]]:
        """(start, remainder) of pipeline `index` at global step `step`, each step `per_step` examples of its
        stream: what `Pipeline.build(start=, remainder=)` takes."""
        delivered = (step - self.step) * per_step
        remainder = self.remainder.after(self.hosts, delivered) if self.remainder is not None else None
        return self.examples[index] + delivered, remainder

    def at(self, step: int, per_step: int) -> "Layout":
        """This layout as of global step `step` (what a checkpoint of that step saves)."""
        places = [self.place(index, step, per_step) for index in range(self.hosts)]
        return Layout(tuple(start for start, _ in places), step, places[0][1])

    def dealt_to(self, hosts: int, length: int, new_length: int, remainder: Optional[Remainder] = None) -> "Layout":
        """This layout continued on `hosts` input pipelines of epoch length `new_length` (`length`: this
        layout's own): what it had left of its epoch dealt to them, then their own epochs. `remainder`: what it
        had left, where the places alone do not say (a mixture's: `MixedRemainder`)."""
        if hosts == self.hosts:
            return self
        remainder = self.remainder or remainder or Remainder(self.examples, length)
        return Layout(tuple(remainder.start(hosts, index, new_length) for index in range(hosts)), self.step,
                      remainder if remainder.rest else None)

    def to_json(self) -> dict:
        remainder = self.remainder
        return {"examples": list(self.examples), "step": self.step,
                "remainder": None if remainder is None else remainder.to_json()}

    @staticmethod
    def from_json(value: dict) -> "Layout":
        return Layout(tuple(value["examples"]), value["step"], remainder_from_json(value.get("remainder")))
