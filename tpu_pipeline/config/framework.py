"""Which framework runs the model (`model.framework`): the config's word, else KERAS_BACKEND.

Decided before anything imports Keras 3, which reads KERAS_BACKEND once, at its first import; the
cluster layer (which devices) and the model layer (which Keras) both follow the one decision.
"""
from __future__ import annotations

import os
from typing import Mapping

from tpu_pipeline.config.model import ModelConfig
from tpu_pipeline.errors import ConfigError

BACKEND_VARIABLE = "KERAS_BACKEND"


def choose_framework(config: ModelConfig, env: Mapping[str, str] = os.environ) -> ModelConfig:
    """`config` with `framework` decided: the config's, else jax when KERAS_BACKEND=jax, else tensorflow.

    A config that names a framework and a KERAS_BACKEND that names another are refused in one line: one
    of the two is a mistake, and guessing would train on the wrong one.
    """
    variable = (env.get(BACKEND_VARIABLE) or "").strip().lower() or None
    chosen = config.framework
    if chosen is None:
        chosen = "jax" if variable == "jax" else "tensorflow"
    elif variable is not None and variable != chosen:
        raise ConfigError(
            f"model.framework is {chosen} but {BACKEND_VARIABLE}={variable}; make them agree: unset "
            f"{BACKEND_VARIABLE}, or set it to {chosen}, or change model.framework"
        )
    if chosen == config.framework:
        return config
    update = {"framework": chosen, **({"keras": "keras3"} if chosen == "jax" else {})}
    if chosen == "jax" and "keras" in config.model_fields_set and config.keras == "tf_keras":
        raise ConfigError(f"model.keras: tf_keras has no JAX backend, but {BACKEND_VARIABLE}=jax; remove model.keras "
                          f"(JAX runs Keras 3) or unset {BACKEND_VARIABLE}")
    return config.model_copy(update=update)
