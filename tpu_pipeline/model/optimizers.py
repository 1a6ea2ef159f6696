"""Optimizers from config (sgd with momentum, adam, adamw), driven by a learning-rate schedule."""
from __future__ import annotations

from types import ModuleType
from typing import Any

from tpu_pipeline.config.model import OptimizerConfig

ADAMW_DEFAULT_WEIGHT_DECAY = 0.004  # Keras's AdamW default.
# Decaying norm scales/offsets and biases hurts accuracy; the usual practice exempts them.
NO_DECAY_NAMES = ["bias", "gamma", "beta"]


def build_optimizer(keras: ModuleType, config: OptimizerConfig, learning_rate: Any) -> Any:
    """Returns a new Keras optimizer; create it inside `strategy.scope()` so its slots are mirrored."""
    weight_decay = config.weight_decay
    if weight_decay is None:
        weight_decay = ADAMW_DEFAULT_WEIGHT_DECAY if config.name == "adamw" else 0.0
    common: dict[str, Any] = dict(learning_rate=learning_rate, global_clipnorm=config.global_clipnorm)
    if weight_decay:
        common["weight_decay"] = weight_decay
    if config.name == "sgd":
        optimizer = keras.optimizers.SGD(momentum=config.momentum, nesterov=config.nesterov, **common)
    else:
        cls = keras.optimizers.Adam if config.name == "adam" else keras.optimizers.AdamW
        if config.name == "adamw":
            common["weight_decay"] = weight_decay  # AdamW's own default would otherwise apply.
        optimizer = cls(beta_1=config.beta_1, beta_2=config.beta_2, epsilon=config.epsilon, **common)
    if weight_decay:
        optimizer.exclude_from_weight_decay(var_names=NO_DECAY_NAMES)
    return optimizer
