"""The input position of a windowed pipeline (data.sequence bucket or pack), saved in `train`'s checkpoints.

A step's example count depends on the data, so where a packed or bucketed stream stands is read
from its elements as `fit` takes them (`PositionLog`), not computed from the step; and with several
workers every host's place is exchanged before a save, since only the chief's checkpoint is kept.
"""
from __future__ import annotations

import json
import time
from typing import Callable, Optional

import tensorflow as tf

from tpu_pipeline.cluster import ClusterInfo
from tpu_pipeline.cluster.coordination import KeyValueStore, StoreUnavailable
from tpu_pipeline.errors import ConfigError, PeerFailure
from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.pipeline.core.row_remainder import RowRemainder
from tpu_pipeline.pipeline.dealt import bucket_examples_delivered
from tpu_pipeline.pipeline.runtime.position_log import PositionLog
from tpu_pipeline.train import mixed_slice, packed_slice
from tpu_pipeline.train.mixture_state import MixtureState

POSITION_KEY = "data"  # a windowed pipeline's input positions in the checkpoint (WindowedPosition)
# How long a save waits for every worker's input position: all save the same step, so a step's skew
# at most, unless a peer is gone.
POSITION_WAIT_SECONDS = 120.0


class WindowedPosition(tf.Module):
    """The input position of a windowed pipeline (data.sequence bucket or pack) in a checkpoint: for
    each input pipeline (one per host), where the window of its last output starts (example, chunk)
    and the outputs of it delivered, as of the last saved step (int64 vectors `example`, `chunk` and
    `in_window`, indexed by input pipeline). `fit` consumes a
    dataset, so what each element taken left the stream at is logged (`PositionLog`) and read back for
    the step a save is at.

    Each host's stream stops at a place of its own, and with several TF_CONFIG workers only the
    chief's checkpoint is kept: so before each save (at the same step on every worker) each worker
    publishes its own position in the cluster's key-value store and assigns everyone's, and the
    kept checkpoint holds every host's place."""

    def __init__(self, pipeline: Pipeline, cluster: ClusterInfo, store: Optional[KeyValueStore] = None,
                 run_key: str = "run", mixture: Optional[MixtureState] = None) -> None:
        super().__init__(name="data_position")
        self._pipeline = pipeline
        self._pipelines = cluster.num_hosts
        # This process's input pipelines: its own on a TF_CONFIG worker; every host's on one client (a TPU pod slice).
        self._local = [cluster.worker_id] if cluster.num_workers > 1 else list(range(cluster.num_hosts))
        self._store = store if cluster.num_workers > 1 else None
        self._key = f"tpu_pipeline/{run_key}/data_position"
        self._replicas = cluster.num_replicas
        sequence = pipeline.plan.sequence.value if pipeline.plan is not None else None
        mode = pipeline.sequence_mode
        # bucket: its places convert to another number of replicas or hosts (the global batch kept): every host reads
        # the one whole stream, a mixture's too
        self._regroups = (mode is not None and sequence is not None
                          and mode.regroups_on_another_slice(sequence.bucket_batch))
        # bucket_batch: tokens: a window's groups differ with the replicas, so the examples they covered are skipped
        self._counts_examples = self._regroups and mode.groups_change_with_the_slice(sequence.bucket_batch)
        # pack: a checkpoint of another number of hosts deals the rows its hosts had left (`packed_slice`)
        self._deals_rows = mode is not None and mode.deals_rows_on_another_slice() and pipeline.service is None
        self._mixture = mixture  # a mixture's saved states: what made each old host's rows (`mixed_slice`)
        self._was: Optional[tuple[int, int]] = None  # (hosts, replicas) of a checkpoint of another slice
        self._was_batch: Optional[int] = None  # the checkpoint's global batch, where this run has another (`rebase`)
        self._remainder: Optional[RowRemainder] = None  # the rows of an older slice being dealt (pack)
        self._places(self._pipelines)
        with tf.init_scope():
            # The replicas whose batches the saved places count (bucket: a window's outputs are theirs).
            self.replicas = tf.Variable(cluster.num_replicas, dtype=tf.int64, trainable=False, name="replicas")
            # pack: the remainder being dealt, as JSON ("" when none: `row_remainder.RowRemainder`)
            self.rows_remainder = tf.Variable("", dtype=tf.string, trainable=False, name="rows_remainder")
        # Each input pipeline's own pipeline: a mixture resumed with new weights continues each one's saved segments.
        self.pipeline_of: Callable[[int], Pipeline] = lambda index: pipeline
        self._logs = {index: PositionLog() for index in self._local}
        self._per_step = {index: 1 for index in self._local}  # elements a pipeline delivers per step
        self._built_at_step = 0

    def _places(self, count: int) -> None:
        """The place variables, one entry per input pipeline (`count` of them: a checkpoint's, before it is
        restored into them, then this run's)."""
        with tf.init_scope():
            self.example = tf.Variable(tf.zeros([count], tf.int64), trainable=False, name="example")
            self.chunk = tf.Variable(tf.zeros([count], tf.int64), trainable=False, name="chunk")
            self.in_window = tf.Variable(tf.zeros([count], tf.int64), trainable=False, name="in_window")

    def check_saved(self, path: str) -> None:
        """Refuses a checkpoint that holds the positions of another number of input pipelines (hosts), unless
        its places regroup (bucket); then the variables take the checkpoint's shape until `resume`."""
        shapes = tf.train.load_checkpoint(path).get_variable_to_shape_map()
        if f"{POSITION_KEY}/window/.ATTRIBUTES/VARIABLE_VALUE" in shapes:
            raise ConfigError(
                f"train.run_dir: {path} holds a packed/bucketed input position in the layout of tpu_pipeline before "
                "0.2 (window numbers), which this version cannot place exactly; start a new train.run_dir"
            )
        saved = shapes.get(f"{POSITION_KEY}/example/.ATTRIBUTES/VARIABLE_VALUE")
        counted = f"{POSITION_KEY}/replicas/.ATTRIBUTES/VARIABLE_VALUE" in shapes
        if saved and list(saved) != [self._pipelines] and ((self._regroups and counted) or self._deals_rows):
            self._places(int(saved[0]))  # restored as saved, then regrouped for this run (`resume`)
            return
        if saved is not None and list(saved) != [self._pipelines]:
            held = f"{saved[0]} host(s)" if saved else "one host, in an older layout"
            raise ConfigError(
                f"train.run_dir: {path} holds the packed/bucketed input positions of {held}, and this run has "
                f"{self._pipelines}; resume it on as many hosts, or start a new train.run_dir"
            )

    def resume(self) -> str:
        """After the checkpoint's restore: this run's places (`_regroup`), and the line that says where the input
        resumes."""
        self._regroup()
        self._deal_rows()
        return self.describe()

    def _deal_rows(self) -> None:
        """A packed stream: the remainder being dealt, as saved; and from a checkpoint of another number of hosts
        a new one, what its hosts had left (the older one's unread rows first), host j beginning at its row j."""
        saved = self.rows_remainder.numpy().decode()
        self._remainder = RowRemainder.from_json(json.loads(saved)) if saved else None
        saved_hosts = int(self.example.shape[0])
        if saved_hosts == self._pipelines or not self._deals_rows:
            return
        places = tuple(self.saved(index) for index in range(saved_hosts))
        replicas = int(self.replicas.numpy())
        if self._mixture is not None:
            self._remainder, dealt = mixed_slice.deal_rows(self._pipeline, places, self._remainder, replicas,
                                                           self._pipelines, self._mixture.saved_states())
            self._mixture.start_own(self._remainder.first_epochs, self._remainder.states)
        else:
            self._remainder, dealt = packed_slice.deal(self._pipeline, places, self._remainder, replicas,
                                                       self._pipelines)
        self._was = (saved_hosts, replicas)  # (pack never regroups: set here only)
        self._places(self._pipelines)
        for name, column in (("example", 0), ("chunk", 1), ("in_window", 2)):
            getattr(self, name).assign([place[column] for place in dealt])
        self.rows_remainder.assign(json.dumps(self._remainder.to_json()))
        self.replicas.assign(self._replicas)

    def rebase(self, step: int, rebased: int, was_batch: int) -> None:
        """A resume with another global batch (`batch_change`; the step is rebased there): a bucketed stream's window
        goes on past the examples the old batch's groups held (`_regroup`); a packed one's places count rows."""
        self._was_batch = was_batch

    def _regroup(self) -> None:
        """A checkpoint of another slice (other hosts or replicas) of a stream whose places regroup (bucket): each
        new pipeline's place is the window the old ones stood in, past the groups they delivered, each group
        now cut into this run's replicas' batches (`regrouped_skip`). Every host reads the whole stream (or is
        the only one), so they all stood in the same window, a group apart at most; their count decides."""
        saved_hosts, saved_replicas = int(self.example.shape[0]), int(self.replicas.numpy())
        if saved_hosts == self._pipelines and saved_replicas == self._replicas and self._was_batch is None:
            return
        if not self._regroups:
            return  # the places count rows (pack), the same on as many hosts whatever the replicas
        example, chunk = int(self.example[0].numpy()), int(self.chunk[0].numpy())
        delivered = [int(value) for value in self.in_window.numpy()]
        if self._counts_examples or self._was_batch is not None:  # the examples the old groups held; the rest anew
            groups = regrouped_skip(delivered, saved_replicas, 1)
            made = self._pipeline  # the window as the checkpoint's run made it (a mixture: its saved weights)
            if self._mixture is not None:
                made = made.with_source(made.source.as_saved(self._mixture.saved_states()[0]))
            chunk = bucket_examples_delivered(made, (example, chunk, 0), groups, saved_replicas, self._was_batch)
            skip = 0
        else:
            skip = regrouped_skip(delivered, saved_replicas, self._replicas)
        self._was = (saved_hosts, saved_replicas)
        self._places(self._pipelines)
        self.example.assign([example] * self._pipelines)
        self.chunk.assign([chunk] * self._pipelines)
        self.in_window.assign([skip] * self._pipelines)
        self.replicas.assign(self._replicas)

    def stream(self, context: tf.distribute.InputContext, step: int) -> tf.data.Dataset:
        """This input pipeline's stream from its saved position (that of `step`), each element's position logged."""
        index = context.input_pipeline_id
        if index not in self._logs:
            self._logs[index] = PositionLog()
        self._logs[index].reset()
        self._per_step[index] = max(1, context.num_replicas_in_sync // max(1, context.num_input_pipelines))
        self._built_at_step = step
        dataset = self.pipeline_of(index).build(context, start=int(self.example[index].numpy()),
                                                chunk=int(self.chunk[index].numpy()),
                                                skip=int(self.in_window[index].numpy()), with_position=True,
                                                remainder=self._remainder)
        return self._logs[index].attach(dataset)

    def saved(self, index: int) -> tuple[int, int, int]:
        """(example, chunk where the window starts, outputs of it delivered) of input pipeline `index`, as saved."""
        return int(self.example[index].numpy()), int(self.chunk[index].numpy()), int(self.in_window[index].numpy())

    def record(self, step: int) -> None:
        """Sets every input pipeline's position to where its stream stood after global step `step` (before a save)."""
        positions = {index: self._after(index, step) for index in self._logs}
        if self._store is not None:
            positions = self._exchange(step, positions)
        examples, chunks, delivered = self.example.numpy(), self.chunk.numpy(), self.in_window.numpy()
        for index, (example, chunk, outputs) in positions.items():
            examples[index], chunks[index], delivered[index] = example, chunk, outputs
        self.example.assign(examples)
        self.chunk.assign(chunks)
        self.in_window.assign(delivered)
        if self._remainder is not None and not packed_slice.still_dealing(
                [tuple(place) for place in zip(examples.tolist(), chunks.tolist(), delivered.tolist())]):
            self._remainder = None  # every host reads its own stream: a plain place again
            self.rows_remainder.assign("")

    def _after(self, index: int, step: int) -> tuple[int, int, int]:
        """(example, chunk where the window starts, outputs of it delivered) of this process's pipeline
        `index` after global step `step`."""
        elements = (step - self._built_at_step) * self._per_step[index]  # taken from the stream built at that step
        if elements > 0:
            return self._logs[index].after(elements)
        return int(self.example[index].numpy()), int(self.chunk[index].numpy()), int(self.in_window[index].numpy())

    def _exchange(self, step: int, mine: dict[int, tuple[int, int, int]]) -> dict[int, tuple[int, int, int]]:
        """Every worker's position at `step`: this worker's published, the others' read from the store.
        Every worker saves the same step, so the wait is a step's skew at most, unless a peer is gone."""
        key = f"{self._key}/{step}"
        try:
            for index, position in mine.items():
                self._store.set(f"{key}/{index}", " ".join(map(str, position)))
            deadline = time.monotonic() + POSITION_WAIT_SECONDS
            values = {index: self._store.get(f"{key}/{index}", timeout_seconds=max(0.001, deadline - time.monotonic()))
                      for index in range(self._pipelines)}
        except (StoreUnavailable, tf.errors.OpError) as error:
            raise PeerFailure(
                f"the workers could not exchange their input positions for the checkpoint of step {step} "
                f"({str(error).splitlines()[0][:200]}); start every worker again with the same command"
            ) from None
        missing = [index for index, value in values.items() if value is None]
        if missing:
            raise PeerFailure(
                f"worker {missing[0]} published no input position for the checkpoint of step {step} within "
                f"{POSITION_WAIT_SECONDS:.0f} s (it stopped or hangs); start every worker again with the same command"
            )
        return {index: tuple(int(part) for part in value.split()) for index, value in values.items()}

    def describe(self) -> str:
        """Where the input resumes: this process's pipelines, each at its own window."""
        examples, chunks, delivered = self.example.numpy(), self.chunk.numpy(), self.in_window.numpy()
        if self._remainder is not None:
            return packed_slice.describe(self._remainder, self._pipelines, self._replicas,
                                         self._was[0] if self._was is not None else None)
        if self._was is not None:
            hosts, replicas = self._was
            groups = int(delivered[0]) // max(1, self._replicas)
            head = (f"this run has {_count(self._pipelines, 'host')} ({_count(self._replicas, 'replica')}), the "
                    f"checkpoint {_count(hosts, 'host')} ({_count(replicas, 'replica')}): the input continues from "
                    f"the window at example {int(examples[0]):,}, past ")
            if self._counts_examples or self._was_batch is not None:
                return head + (f"the first {int(chunks[0]):,} of its examples the old steps' batches held (bucket "
                               f"order), its other examples batched for {_count(self._replicas, 'replica')}")
            return head + (f"its first {groups} step(s) of batches, each step's batch now cut for "
                           f"{_count(self._replicas, 'replica')}")

        def place(index: int) -> str:
            inside = "" if not chunks[index] else (
                f" (its first {int(chunks[index]):,} examples delivered on an earlier slice)" if self._regroups
                else f" (its chunk {int(chunks[index])})")
            return (f"from the window at example {int(examples[index]):,}{inside}, past its first "
                    f"{int(delivered[index])} output(s)")

        if self._pipelines == 1:
            return f"the input pipeline continues {place(0)}"
        places = [f"input pipeline {index} of {self._pipelines} {place(index)}" for index in self._local]
        return "each host's input continues from its own place in the checkpoint: " + "; ".join(places)


def regrouped_skip(delivered: list[int], was_replicas: int, replicas: int) -> int:
    """The outputs of the window to skip on `replicas` replicas, from the outputs the old pipelines had delivered
    of it (`delivered`, one per old pipeline) on `was_replicas`: each step took one group of `was_replicas`
    outputs (every host reading the whole stream keeps its own of them), so the groups delivered are the most
    any pipeline's count reaches, rounded up to whole groups (a host stops at its own last output of a step)."""
    groups = max(-(-count // was_replicas) for count in delivered)
    return groups * replicas


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'s' if number != 1 else ''}"
