"""The rows a packed stream's input pipelines had left of an epoch, dealt to another number of them (a resume
on another slice).

Why rows, and why it can be exact: a packed pipeline's place is (where its pool of windows starts, the
example and chunk; the rows of that pool it delivered), and its rows are a pure function of (data.seed,
epoch, its index among P) and that place. So what P old pipelines had left is known row for row: each one's
stream rebuilt from its place, its records cut at the end of epoch E (`epoch`: the last epoch any row they
delivered holds a chunk of), packed as it packed them. The last pool of each is cut there too: rows that were
never delivered, so no chunk is doubled or dropped.

    R = for t = 0, 1, ...: old pipeline 0's next row, old pipeline 1's next, ..., old pipeline P-1's

New pipeline j of M reads R[j], R[j + M], ...; then its own stream from epoch E + 1, as a run started on M
pipelines reads it. A pipeline in R saves its place as (the index of its next row in R, `IN_REST`, 0); one in
its own stream, a plain pool place. A change of slice before R is done makes the pending rows of R the head of
the next remainder (`older`): one more level of a few integers per pipeline, gone once it is dealt.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from tpu_pipeline.pipeline.core.remainder import MixtureDealt

IN_REST = -1  # a place's chunk while its pipeline reads dealt rows: its example is then its next row's index in R

Place = tuple[int, int, int]  # (example where the pool starts, its chunk, rows of the pool delivered)


def delivered_epoch(example: int, chunk: int, length: int) -> int:
    """The last epoch holding a chunk before (`example`, `chunk`) of a stream of epochs of `length` (-1: none)."""
    return (example - (1 if chunk == 0 else 0)) // length


@dataclasses.dataclass(frozen=True)
class RowRemainder(MixtureDealt):
    """What `len(places)` old pipelines (epochs of `length` records each, `replicas` in all) had left from their
    `places` up to the end of `epoch`, as rows; before those, the rows of `older` (a remainder they were still
    dealing) that they had not delivered."""

    places: tuple[Place, ...]
    length: int
    epoch: int
    replicas: int
    older: Optional["RowRemainder"] = None
    # A mixture's (`length` 0): E of each source, whose own stream ends there, and each old pipeline's saved mixture
    # state (one for all where they agree); a new pipeline's own mixture begins each source at its epoch E_s + 1.
    epochs: tuple[int, ...] = ()
    states: tuple[str, ...] = ()

    @property
    def hosts(self) -> int:
        return len(self.places)

    @property
    def stop(self) -> int:
        """The stream position where the old pipelines' records are cut: the end of `epoch`."""
        return (self.epoch + 1) * self.length

    def own_place(self, index: int) -> Place:
        """Old pipeline `index`'s place in its own stream (its start, if it was still reading `older`'s rows)."""
        place = self.places[index]
        if place[1] != IN_REST:
            return place
        assert self.older is not None, "a place in dealt rows needs the remainder they come from"
        return ((self.older.epoch + 1) * self.length, 0, 0)

    def to_json(self) -> dict:
        mixture = {"epochs": list(self.epochs), "states": list(self.states)} if self.states else {}
        return {"places": [list(place) for place in self.places], "length": self.length, "epoch": self.epoch,
                "replicas": self.replicas, "older": None if self.older is None else self.older.to_json(), **mixture}

    @staticmethod
    def from_json(value: Optional[dict]) -> Optional["RowRemainder"]:
        if value is None:
            return None
        return RowRemainder(tuple(tuple(place) for place in value["places"]), value["length"], value["epoch"],
                            value["replicas"], RowRemainder.from_json(value["older"]),
                            tuple(value.get("epochs", ())), tuple(value.get("states", ())))


def epoch_to_deal(places: tuple[Place, ...], length: int, older: Optional[RowRemainder],
                  next_pool: Callable[[int], Optional[tuple[int, int]]], last_epoch: int) -> int:
    """E: the last epoch holding a chunk that a pipeline at `places` delivered, or that its pool in progress
    holds (its other rows go with it), or that `older` covers. `next_pool(index)`: (example, chunk) where the
    pool after pipeline `index`'s current one starts, None where its stream ends in it (then `last_epoch`)."""
    epoch = older.epoch if older is not None else -1
    for index, (example, chunk, delivered) in enumerate(places):
        if chunk == IN_REST:
            continue  # its own stream has not begun: `older.epoch` covers what it read
        end = (example, chunk) if delivered == 0 else next_pool(index)
        epoch = max(epoch, last_epoch if end is None else delivered_epoch(*end, length))
    return epoch


def dealt_places(hosts: int) -> tuple[Place, ...]:
    """The places of `hosts` new pipelines as they begin to read the dealt rows: pipeline j reads R[j] first.
    One whose share is empty goes on with its own stream, from epoch E + 1 (`Pipeline.build`)."""
    return tuple((index, IN_REST, 0) for index in range(hosts))
