"""How a source's records are split between input pipelines.

Sharding is by record, balanced ('auto'): each epoch's record order is the files in that epoch's
order (from the seed tree, identical on every host) laid end to end, and input pipeline i reads
records [i*L, (i+1)*L) of it, L = N // n. So every pipeline reads exactly L records in every epoch
(pipelines stay in step, and a position is two integers: epoch and offset); the N mod n records at
the end of the epoch's order are left out of that epoch (other ones each epoch), with a log line. A
pipeline reads only the files its range touches, skipping (not parsing) the head of its first file.
The record counts come from metadata.json, or from one counting pass over a bare glob.

tensorflow/models' InputReader split ('file': whole files per pipeline, uneven when files are;
'element': every pipeline reads everything and keeps every n-th element) stays available by name.
"""
from __future__ import annotations

import tensorflow as tf
from absl import logging

from tpu_pipeline.errors import ConfigError


def choose_sharding(requested: str, num_files: int, num_pipelines: int, balanced: bool = False) -> str:
    """'none', 'balanced', 'file' or 'element' for this many files and input pipelines.

    `balanced`: the source can split records evenly (it knows or can count its records); then
    'auto' picks it.
    """
    if num_pipelines <= 1 or requested == "off":
        return "none"
    if requested == "balanced" or (requested == "auto" and balanced):
        if not balanced:
            raise ConfigError("data.source.sharding=balanced needs a source of TFRecord files or arrays; use auto")
        return "balanced"
    if requested == "auto":
        if num_files >= num_pipelines:
            return "file"
        logging.warning(
            "Only %d file(s) for %d input pipelines: sharding by element, so every pipeline reads "
            "every file and keeps 1/%d of the records. Write at least %d shards to shard by file.",
            num_files, num_pipelines, num_pipelines, num_pipelines,
        )
        return "element"
    if requested == "file" and num_files < num_pipelines:
        raise ConfigError(
            f"data.source.sharding=file needs at least one file per input pipeline, but there are "
            f"{num_files} file(s) for {num_pipelines} pipelines; use sharding=auto or element, or write more shards"
        )
    return requested


def balanced_range(total: int, context: tf.distribute.InputContext, cover_all: bool = False) -> tuple[int, int]:
    """Records [low, high) of an epoch's order that input pipeline i reads: L = total // n each (the
    rest left out), or with `cover_all` every record, shares uneven by at most one (evaluation)."""
    pipelines, index = context.num_input_pipelines, context.input_pipeline_id
    if cover_all:
        return index * total // pipelines, (index + 1) * total // pipelines
    length = total // pipelines
    return index * length, (index + 1) * length
