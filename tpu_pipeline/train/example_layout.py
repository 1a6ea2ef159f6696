"""Where each input pipeline of an example stream stands, in `train`'s checkpoints: what lets a run resume on
another number of hosts (a preempted v5e-32 back as a v5e-16) and go on exactly.

A stream of examples (images, pad mode: no window) delivers a fixed count each step, so while the hosts stay
a pipeline's place is computed from the step. The checkpoint keeps the `core.remainder.Layout` of the saved
step: each pipeline's stream position, and the remainder of an older layout still being dealt (a few
integers per pipeline, as JSON). Resumed on as many hosts, each pipeline goes on from its own place; on
another number, what the old pipelines had left of their epoch is dealt to the new ones in turns
(`Layout.dealt_to`), then each reads its own shard of the next epochs. Every host computes the same layout
from the checkpoint and the step, so nothing is exchanged between workers before a save.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

import tensorflow as tf

from tpu_pipeline.cluster import ClusterInfo
from tpu_pipeline.config import Config
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.pipeline.core.remainder import Layout, MixedRemainder
from tpu_pipeline.train import mixed_slice
from tpu_pipeline.train.mixture_state import MixtureState
from tpu_pipeline.train.started_with import check_hosts, hosts

LAYOUT_KEY = "input_layout"  # an example stream's layout in the checkpoint (ExampleLayout)


def shard_length(pipeline: Pipeline, count: int, where: str) -> int:
    """The epoch length of each of `count` input pipelines (balanced shards: the same for all), for a resume on
    another number of hosts; one line naming the fix (`where`: the run_dir) where the source has none."""
    length = pipeline.source.epoch_length(tf.distribute.InputContext(count, 0, count))
    if not length:
        raise ConfigError(
            f"{where}: resuming on another number of hosts needs shards of a fixed length, and "
            f"{type(pipeline.source).__name__} has none with this sharding; use data.source.sharding=auto "
            "(balanced) on TFRecord files or arrays, or resume on as many hosts as before")
    return length


class ExampleLayout(tf.Module):
    """The layout of an example stream's input pipelines as of the last saved step (`saved`, JSON), and the
    one this run reads from (`layout`): the saved one, dealt to this run's number of hosts."""

    def __init__(self, pipeline: Pipeline, cluster: ClusterInfo, mixture: Optional[MixtureState] = None) -> None:
        super().__init__(name="input_layout")
        self._pipeline = pipeline
        self._cluster = cluster
        self._mixture = mixture  # a mixture's saved states: its sources' places, dealt on other hosts (`mixed_slice`)
        self.layout = Layout((0,) * cluster.num_hosts)
        self._was = self.layout  # the layout the checkpoint was saved in (`resume`)
        with tf.init_scope():
            self.saved = tf.Variable(json.dumps(self.layout.to_json()), dtype=tf.string, trainable=False, name="layout")

    @staticmethod
    def of(pipeline: Pipeline, cluster: ClusterInfo, config: Config,
           mixture: Optional[MixtureState] = None) -> Optional["ExampleLayout"]:
        """The layout of a pipeline that deals remainders (an example stream, of one source or a `mixture`); None
        for a windowed stream, whose places are its own (`windowed_position`), or one through tf.data service."""
        if pipeline.deals_remainders:
            return ExampleLayout(pipeline, cluster, mixture)
        check_hosts(config, tf.train.latest_checkpoint(os.path.join(config.train.run_dir, "checkpoints")), cluster.num_hosts)
        return None

    def _per_step(self, count: int) -> int:
        """Examples each of `count` input pipelines delivers a step: its share of the global batch."""
        return self._pipeline.global_batch_size() // count

    def _length(self, count: int, run_dir: str) -> int:
        return shard_length(self._pipeline, count, f"train.run_dir={run_dir}")

    def resume(self, step: int, run_dir: str) -> str:
        """After the checkpoint's restore: this run's layout, from the one saved at `step`, and the line that says
        where the input resumes. A checkpoint written before layouts were saved holds the initial one; its
        pipelines stood at `step` examples a step each."""
        saved = Layout.from_json(json.loads(self.saved.numpy().decode()))
        if saved.step != step:
            saved = Layout((step * self._per_step(saved.hosts),) * saved.hosts, step)
        count = self._cluster.num_hosts
        self._was = saved
        if saved.hosts == count:
            self.layout = saved
        elif self._mixture is not None:  # each source's epochs dealt; then every host's own mixture (`mixed_slice`)
            remainder = saved.remainder or mixed_slice.deal(self._pipeline, saved, self._mixture.saved_states(),
                                                           self._cluster.num_replicas)
            self.layout = saved.dealt_to(count, 0, 0, remainder)
            self._mixture.start_own(remainder.first_epochs, remainder.states)
        else:
            self.layout = saved.dealt_to(count, self._length(saved.hosts, run_dir), self._length(count, run_dir))
        return self._describe(run_dir)

    def start_of(self, index: int, step: int) -> int:
        """Input pipeline `index`'s stream position at global step `step` (in a dealt rest: minus what is left)."""
        return self.layout.place(index, step, self._per_step(self.layout.hosts))[0]

    def rebase(self, step: int, rebased: int, was_batch: int) -> None:
        """The saved layout of global step `step` made that of `rebased`, this run's step for the same examples
        (a resume with another global batch, `was_batch` before: `batch_change`)."""
        saved = Layout.from_json(json.loads(self.saved.numpy().decode()))
        if saved.step != step:  # a checkpoint from before layouts were saved: its places from the step
            saved = Layout((step * was_batch // saved.hosts,) * saved.hosts, step)
        self.saved.assign(json.dumps(dataclasses.replace(saved, step=rebased).to_json()))

    def stream(self, context: tf.distribute.InputContext, step: int) -> tf.data.Dataset:
        """Input pipeline `context`'s stream from global step `step` on: from its place in the layout (its
        share of an old layout's remainder first, if it has one)."""
        index = context.input_pipeline_id
        start, remainder = self.layout.place(index, step, self._per_step(self.layout.hosts))
        pipeline = self._mixture.pipeline(index) if self._mixture is not None else self._pipeline  # its own weights
        return pipeline.build(context, start=start, remainder=remainder)

    def record(self, step: int) -> None:
        """The layout as of global step `step`, for the checkpoint saved there."""
        self.saved.assign(json.dumps(self.layout.at(step, self._per_step(self.layout.hosts)).to_json()))

    def _describe(self, run_dir: str) -> str:
        """Where the input resumes: the old layout's rest dealt, or each pipeline's own place."""
        was, now, remainder = self._was, self.layout, self.layout.remainder
        if remainder is None and was.hosts == now.hosts:
            return f"the input pipelines continue from example {sum(now.examples):,} of the training stream"
        replicas = self._cluster.num_replicas
        head = (f"this run has {hosts(now.hosts)} ({replicas} replica{'s' if replicas != 1 else ''}), the checkpoint "
                f"{hosts(was.hosts)}: " if was.hosts != now.hosts else "")
        if isinstance(remainder, MixedRemainder):
            return head + mixed_slice.describe(remainder, self._pipeline.source.names, now.hosts)
        if remainder is None and self._mixture is not None:
            return head + "each input pipeline mixes its own shards, every source from its next epoch"
        if remainder is None:  # the old hosts stood at an epoch's end
            return head + f"each input pipeline starts its own shard of data epoch {now.examples[0] // self._length(now.hosts, run_dir) + 1}"
        epoch, rest = remainder.epoch + 1, remainder.rest
        to = "this host" if now.hosts == 1 else f"the {now.hosts} hosts in turns"
        if was.hosts == now.hosts:
            return (f"the input pipelines go on with the rest of data epoch {epoch} of {hosts(remainder.hosts)}, "
                    f"{rest:,} examples dealt to {to}, then each reads its own shard")
        return head + f"the rest of data epoch {epoch}, {rest:,} examples, is dealt to {to}, then each reads its own shard"
