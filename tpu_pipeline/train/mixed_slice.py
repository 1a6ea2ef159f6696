"""A mixture resumed on another number of hosts: what the checkpoint's hosts had left of each source's epoch, dealt.

A mixture host's place is a count of its stream (`ExampleLayout`), and from it the schedule's closed form gives
where each source's own stream stood (`MixtureSource.source_places`). So per source s, E_s is the last epoch any
old host had begun; each old host's mixture, rebuilt from its place with every source ending at the end of its
E_s, is what it had left (`core.remainder.MixedRemainder`: its length, from the same closed form). That is dealt
as an example stream's rest is (in turns), and then each new host mixes its own shards, each source from its
epoch E_s + 1 (`MixtureSource.first_epochs`, kept in the mixture's saved state).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.pipeline.core.remainder import Layout, MixedRemainder
from tpu_pipeline.pipeline.core.row_remainder import IN_REST, Place, RowRemainder, dealt_places
from tpu_pipeline.pipeline.dealt import next_pool
from tpu_pipeline.pipeline.mixtures.mixture_source import MixtureSource


def deal(pipeline: Pipeline, layout: Layout, states: list[str], replicas: int) -> MixedRemainder:
    """The remainder of a mixture whose `layout.hosts` input pipelines stood at `layout.examples`, each made by its
    saved mixture state (`states`: one a pipeline, or one for all)."""
    hosts, source = layout.hosts, pipeline.source
    states = one_a_host(states, hosts)
    contexts = [tf.distribute.InputContext(hosts, index, replicas) for index in range(hosts)]
    olds = [source.as_saved(state) for state in states]
    places = np.stack([old.source_places(context, example)
                       for old, context, example in zip(olds, contexts, layout.examples)])
    lengths = np.asarray(source.epoch_lengths(contexts[0]), np.int64)  # balanced shards: the same on every host
    epochs = tuple(int(epoch) for epoch in -(-places.max(axis=0) // lengths) - 1)
    lefts = tuple(dataclasses.replace(old, last_epochs=epochs).stream_length(context) - example
                  for old, context, example in zip(olds, contexts, layout.examples))
    return MixedRemainder(layout.examples, 1, 0, lefts, epochs, kept(states))


def deal_rows(pipeline: Pipeline, places: tuple[Place, ...], older: RowRemainder | None, replicas: int, hosts: int,
              states: list[str]) -> tuple[RowRemainder, tuple[Place, ...]]:
    """A packed mixture's `packed_slice.deal`: E_s per source, from where each old host's current pool ends (its rows
    go with it: `next_pool`), through the schedule's closed form; the old hosts' rows are then rebuilt as their
    states made them, each source ending at its E_s (`dealt.rows_left`)."""
    count, source = len(places), pipeline.source
    states = one_a_host(states, count)
    windowed = pipeline.parts.until("windowed", inclusive=True)
    epochs = np.asarray(older.epochs if older is not None else [-1] * len(source.parts), np.int64)
    for index, place in enumerate(places):
        if place[1] == IN_REST:
            continue  # its own stream has not begun: `older.epochs` covers what it read
        context = tf.distribute.InputContext(count, index, replicas)
        old = source.as_saved(states[index])
        end = place[:2] if place[2] == 0 else next_pool(pipeline.with_source(old), windowed, context, place)
        read = old.stream_length(context) if end is None else end[0] + (1 if end[1] else 0)  # records with a chunk out
        lengths = np.asarray(old.epoch_lengths(context), np.int64)
        epochs = np.maximum(epochs, -(-old.source_places(context, read) // lengths) - 1)
    remainder = RowRemainder(places, 0, int(epochs.max()), replicas, older, tuple(int(e) for e in epochs),
                             kept(states))
    return remainder, dealt_places(hosts)


def one_a_host(states: list[str], hosts: int) -> list[str]:
    """The checkpoint's mixture states, one for each of its `hosts` (it keeps one for all where they agree)."""
    return states if len(states) == hosts else states[:1] * hosts


def kept(states: list[str]) -> tuple[str, ...]:
    """What a remainder keeps of the old hosts' states: one for all where they agree."""
    return tuple(states) if len(set(states)) > 1 else tuple(states[:1])


def describe(remainder: MixedRemainder, names: tuple[str, ...], hosts: int) -> str:
    """What is dealt: each source's epoch whose rest goes to the new hosts, and how many examples in all."""
    epochs = ", ".join(f"{name} {epoch + 1}" for name, epoch in zip(names, remainder.epochs) if epoch >= 0)
    to = "this host" if hosts == 1 else f"the {hosts} hosts in turns"
    return (f"the rest of the sources' data epochs ({epochs or 'none begun'}), {remainder.rest:,} mixed examples, is "
            f"dealt to {to}, then each mixes its own shards, every source from its next epoch")


def weights_line(states: tuple[str, ...], source: MixtureSource) -> str | None:
    """The line for weights changed along with the slice (`source`: this config's mixture): the dealt rest keeps
    the old ones (None: none changed)."""
    changed = source.weight_changes(states[0])
    if not changed:
        return None
    return (f"data.mixture: weights changed since the checkpoint ({changed}); the dealt rest keeps the old ones, and "
            "each host's own mixture takes the new ones from its first example")
