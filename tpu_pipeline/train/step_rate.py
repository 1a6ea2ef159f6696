"""How fast the config's model trains on this host when input costs nothing: `tpu-pipeline doctor`
compares it with the input pipeline's rate, to say whether tuning the input can speed training up.

The model is built and compiled exactly as `train` builds it (`runner._model_for`, under the
resolved strategy); it trains on one real batch of the config's pipeline, repeated from memory,
so the figure is the model's own step rate. Its time is that of the training steps only (the
`StepClock` of the progress lines and metrics.json): `warmup` executions first (tracing, XLA
compilation) are left out. The weights are thrown away; nothing is written.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

from tpu_pipeline.cluster import ClusterInfo
from tpu_pipeline.config import Config
from tpu_pipeline.config.data import ServiceConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.model import tf_keras
from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.pipeline.checks.vocabularies import config_vocabulary
from tpu_pipeline.train.callbacks import StepClock
from tpu_pipeline.train.framework import framework_and_cluster
from tpu_pipeline.train.model_inputs import element_shape
from tpu_pipeline.train.runner import _model_for, _training_data


@dataclasses.dataclass(frozen=True)
class StepRate:
    """The model's training rate on this host, input excluded."""

    steps_per_sec: float
    steps: int  # timed steps
    seconds: float  # in them
    warmup_seconds: float  # the warm-up executions (tracing, compilation)
    global_batch_size: int
    device: str  # e.g. "cpu, 1 replica(s)"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _Clock(tf_keras.callbacks.Callback):
    """A StepClock that starts after `warmup` executions (batches, in Keras's callbacks)."""

    def __init__(self, warmup: int) -> None:
        super().__init__()
        self.clock = StepClock()
        self.warmup = warmup
        self.warmup_seconds = 0.0
        self._seen = 0

    def on_train_batch_begin(self, batch: int, logs: Optional[dict] = None) -> None:
        self._began = time.perf_counter()
        self.clock.step_begins()

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        self._seen += 1
        if self._seen <= self.warmup:
            self.warmup_seconds += time.perf_counter() - self._began
            if self._seen < self.warmup:
                return  # the clock starts timing after the step that ends the warm-up
        # The steps done: one fit of one epoch from a new model, so Keras's batch index (an execution's
        # last step) + 1, which JAX's trainer gives too (its variables are detached mid-fit).
        self.clock.step_ends(batch + 1)


def model_step_rate(config: Config, steps: int = 5, warmup: int = 2,
                    cluster: Optional[ClusterInfo] = None) -> StepRate:
    """Times `steps` executions of the config's model after `warmup` (see the module's docstring)."""
    if config.data is None:
        raise ConfigError("the config has no 'data' section: the model's inputs are read from it")
    config, cluster = framework_and_cluster(config, cluster)  # Keras 3 on JAX too (model.framework)
    target = "tpu" if cluster.kind == "tpu" else "cpu"
    # One batch of this host's own pipeline (data.service would make it elsewhere; one batch is enough).
    data = _training_data(config).model_copy(update={"service": ServiceConfig()})
    pipeline = Pipeline.from_config(data, target=target, num_classes=config.train.num_classes,
                                    vocab=config_vocabulary(config))
    input_shape = element_shape(pipeline, config.train.task)
    model = _model_for(config, cluster, pipeline, input_shape, config.train.steps_per_epoch or 1000, None)
    dataset = cluster.strategy.distribute_datasets_from_function(
        lambda context: pipeline.build(context).take(1).cache().repeat())
    clock = _Clock(max(1, warmup))
    executions = max(1, warmup) + max(1, steps)
    per_execution = getattr(model, "_steps_per_execution", None)  # compile's steps_per_execution (a variable)
    per_execution = int(per_execution.numpy()) if per_execution is not None else 1
    model.fit(dataset, epochs=1, steps_per_epoch=executions * per_execution, callbacks=[clock], verbose=0)
    timed = clock.clock
    if not timed.seconds or not timed.steps:
        raise ConfigError("model: no training step could be timed")
    return StepRate(timed.steps / timed.seconds, timed.steps, timed.seconds, clock.warmup_seconds,
                    config.data.batch_size, f"{cluster.kind}, {cluster.num_replicas} replica(s)")
