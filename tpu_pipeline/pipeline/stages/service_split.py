"""Where a pipeline leaves this host for tf.data service workers (`data.service`), and what crosses.

The stages before `ServiceSplit` run on the workers, once for all consumers: they are built with
a context of one input pipeline (the service, not the host, splits the data between trainer
hosts), and the graph is sent to the dispatcher. The stages after it (prefetch to the device,
options) run on each trainer host. TensorFlow's `distribute` does the work; this module decides
its arguments: job names, coordinated reads, compression, and a resumed run's fresh job.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Optional

import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.stages.base import Stage, StageContext


@dataclasses.dataclass(frozen=True)
class ServiceSplit(Stage):
    """Stages before this one run on the tf.data service at `address`; stages after it on this host."""

    roles: ClassVar[tuple[str, ...]] = ("service",)
    address: str
    mode: str = "distributed_epoch"
    job_name: Optional[str] = None
    num_consumers: Optional[int] = None
    compression: str = "auto"
    where: str = "data.service"  # the config key, for messages

    def worker_context(self, context: tf.distribute.InputContext) -> tf.distribute.InputContext:
        """The context the workers' stages are built with: one pipeline for every consumer (the
        same graph, so consumers can share a job), per-replica batches as this host's replicas get."""
        return tf.distribute.InputContext(1, 0, context.num_replicas_in_sync)

    def job(self, context: tf.distribute.InputContext, first_epoch: int) -> Optional[str]:
        """The job this consumer reads: the configured name, with the epoch the stream starts at (a
        resumed run's stream is another dataset, which a job of the same name would refuse)."""
        hosts = context.num_input_pipelines
        if self.job_name is None:
            if hosts > 1:
                raise ConfigError(
                    f"{self.where}.job_name: {hosts} trainer hosts read through the service and must share one job, "
                    f"or each would get every example; set {self.where}.job_name to a name new for this run, e.g. "
                    f"{self.where}.job_name=resnet-run-7"
                )
            return None  # an anonymous job for this consumer alone
        return self.job_name if first_epoch == 0 else f"{self.job_name}/from-epoch-{first_epoch}"

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        """`context.first_epoch`: the epoch the job begins with (a restart names a job of its own)."""
        first_epoch = context.first_epoch
        consumer_index = None
        if self.num_consumers is not None:
            if self.num_consumers != context.num_input_pipelines:
                raise ConfigError(
                    f"{self.where}.num_consumers={self.num_consumers}, but {context.num_input_pipelines} trainer "
                    f"host(s) read: coordinated reads need one consumer per host; set it to "
                    f"{context.num_input_pipelines} (or leave it unset)"
                )
            consumer_index = context.input_pipeline_id
        return dataset.apply(tf.data.experimental.service.distribute(
            processing_mode=self.mode,
            service=self.address if "://" in self.address else f"grpc://{self.address}",
            job_name=self.job(context.input, first_epoch),
            consumer_index=consumer_index,
            num_consumers=self.num_consumers,
            compression="AUTO" if self.compression == "auto" else None,
        ))
