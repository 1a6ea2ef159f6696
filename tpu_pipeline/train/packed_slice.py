"""A packed stream resumed on another number of hosts: what the checkpoint's hosts had left, dealt in rows.

`WindowedPosition` keeps each host's place (pool start, rows of it delivered); here the places of a checkpoint
of P hosts become a `core.row_remainder.RowRemainder` (E: the last epoch a delivered row reached, found by
chunking each host's current pool once) and the M new hosts' first places: host j at row j of R. The line a
resume prints is made here too.
"""
from __future__ import annotations

import tensorflow as tf

from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.pipeline.core.row_remainder import IN_REST, Place, RowRemainder, dealt_places, epoch_to_deal
from tpu_pipeline.pipeline.dealt import next_pool
from tpu_pipeline.train.example_layout import shard_length


def deal(pipeline: Pipeline, places: tuple[Place, ...], older: RowRemainder | None, replicas: int,
         hosts: int) -> tuple[RowRemainder, tuple[Place, ...]]:
    """(the remainder of a checkpoint whose hosts stood at `places` (of `replicas` replicas, still dealing
    `older` or not), the places of this run's `hosts` as they begin to read it)."""
    length = shard_length(pipeline, len(places), "train.run_dir")
    windowed = pipeline.parts.until("windowed", inclusive=True)
    repeat = pipeline.parts.repeat
    last_epoch = 0 if repeat is None else (repeat.count or 1 << 40) - 1

    def after_pool(index: int) -> tuple[int, int] | None:
        context = tf.distribute.InputContext(len(places), index, replicas)
        return next_pool(pipeline, windowed, context, places[index])

    epoch = epoch_to_deal(places, length, older, after_pool, last_epoch)
    return RowRemainder(places, length, epoch, replicas, older), dealt_places(hosts)


def describe(remainder: RowRemainder, hosts: int, replicas: int, was_hosts: int | None) -> str:
    """Where a packed stream resumes while a remainder is dealt: `was_hosts` the checkpoint's hosts when they differ
    from this run's (the remainder was dealt now), None when this run goes on dealing one."""
    to = "this host" if hosts == 1 else f"the {hosts} hosts in turns"
    rows = (f"the rows {remainder.hosts} host{'s' if remainder.hosts != 1 else ''} had left of data epoch "
            f"{remainder.epoch + 1}" + (" (after the rows of an earlier slice they had not read)"
                                        if remainder.older is not None else ""))
    if was_hosts is None:
        return f"the input pipelines go on with {rows}, dealt to {to}, then each reads its own shard"
    head = (f"this run has {hosts} host{'s' if hosts != 1 else ''} ({replicas} replica{'s' if replicas != 1 else ''}), "
            f"the checkpoint {was_hosts} host{'s' if was_hosts != 1 else ''}: ")
    return head + f"{rows}, packed as they packed them, are dealt to {to}, then each reads its own shard"


def still_dealing(places: list[Place]) -> bool:
    """Whether any host still reads dealt rows (else the remainder is done and dropped from the checkpoint)."""
    return any(chunk == IN_REST for _, chunk, _ in places)
