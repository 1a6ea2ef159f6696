"""The model and optimizer as parts of the run's `tf.train.Checkpoint`, whatever Keras runs them.

A run's checkpoint is one `tf.train.Checkpoint`: the model, the optimizer, the input position, a
mixture's weights, the history and what the run was started with, written together and indexed
once, so a resume never pairs weights with another step's input position. tf_keras models, and
Keras 3 models on the TensorFlow backend, are TensorFlow trackables and go in as they are.

A Keras 3 model on JAX is not: its variables hold `jax.Array`s. `KerasVariables` mirrors them in
tf.Variables (one per Keras variable, named by its path), copied from the device before each save
and back after a restore. Orbax would write a second checkpoint beside ours, whose step would then
have to be matched to the input position's; the mirror keeps one atomic checkpoint, the same
rotation, the same SIGTERM save and the same resume checks on both frameworks. The price is a host
copy of the weights per save, which a save pays anyway. The mirror reads each array's local copy, so
it serves data parallelism (replicated weights), not weights sharded over devices.
"""
from __future__ import annotations

import contextlib
import re
from typing import Any, Iterable

import numpy as np
import tensorflow as tf


def _on_jax(model: Any) -> bool:
    return hasattr(model, "jax_state_sync")


class KerasVariables(tf.Module):
    """Keras 3 variables (JAX) as tf.Variables of the same names, shapes and dtypes, for tf.train.Checkpoint."""

    def __init__(self, variables: Iterable[Any], name: str) -> None:
        super().__init__(name=name)
        self._keras = list(variables)
        keys = _unique_keys(self._keras)
        with tf.init_scope():
            self.values = {key: tf.Variable(_host_value(variable), trainable=False, name=key)
                           for key, variable in zip(keys, self._keras)}
        self._mirrors = [self.values[key] for key in keys]

    def pull(self) -> None:
        """Device → mirror: what the next save writes."""
        for variable, mirror in zip(self._keras, self._mirrors):
            mirror.assign(_host_value(variable))

    def push(self) -> None:
        """Mirror → device: after a restore."""
        for variable, mirror in zip(self._keras, self._mirrors):
            variable.assign(mirror.numpy())


def _unique_keys(variables: list[Any]) -> list[str]:
    """Each variable's path as a checkpoint name; a path met twice gets its index."""
    keys, seen = [], set()
    for index, variable in enumerate(variables):
        key = re.sub(r"[^A-Za-z0-9_.-]", ".", str(getattr(variable, "path", None) or variable.name))
        if key in seen:
            key = f"{key}.{index}"
        seen.add(key)
        keys.append(key)
    return keys


def _host_value(variable: Any) -> np.ndarray:
    """A variable's value on the host: the local copy of a replicated array (every process holds one)."""
    value = variable.value
    if getattr(value, "is_fully_addressable", True):
        return np.asarray(value)
    if not value.sharding.is_fully_replicated:
        raise ValueError(f"{variable.path}: a weight sharded over several processes cannot be mirrored for the "
                         "checkpoint (data parallelism replicates every weight)")
    # Not `addressable_shards`: with one device per process, jax 0.10 raises on it (measured).
    return np.asarray(value.addressable_data(0))


def _build_slots_in_scope(model: Any) -> None:
    """Creates the optimizer's slots now (under the model's strategy on TensorFlow), not in fit's first step.

    tf_keras builds them inside the first traced training step; a tf.function that creates variables
    is traced a second time without them, so fit traced its step twice (measured: 3 s of an 18 s
    language-model run on 2 CPU replicas, the same on every start and resume). Built here, the step is
    traced once, and a restore fills the slots at once instead of deferring them. Keras 3 builds them
    before tracing already (its symbolic build); building them here changes nothing there.
    """
    optimizer = model.optimizer
    built = getattr(optimizer, "built", getattr(optimizer, "_built", False))  # Keras 3's name, tf_keras's
    if built or not model.trainable_variables:
        return  # built already, or a model whose variables do not exist yet (fit builds both)
    strategy = getattr(model, "distribute_strategy", None)  # TensorFlow's; a JAX model has none
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        optimizer.build(model.trainable_variables)


class CheckpointedModel:
    """The model's and optimizer's parts of the run's checkpoint, and the copies a JAX model needs
    around a save (`before_save`) and a restore (`after_restore`)."""

    def __init__(self, model: Any, with_optimizer: bool = True) -> None:
        self.model = model
        self.on_jax = _on_jax(model)
        if not self.on_jax:
            if with_optimizer:
                _build_slots_in_scope(model)
            self.parts = {"model": model, **({"optimizer": model.optimizer} if with_optimizer else {})}
            self._mirrors: list[KerasVariables] = []
            return
        self._mirrors = [KerasVariables(model.weights, "model")]  # not the metrics' running sums
        if with_optimizer:
            _build_slots_in_scope(model)  # the mirror needs the slots, which exist only after a step otherwise
            self._mirrors.append(KerasVariables(model.optimizer.variables, "optimizer"))
        self.parts = dict(zip(("model", "optimizer"), self._mirrors))

    def before_save(self) -> None:
        if self.on_jax:
            self.model.jax_state_sync()  # mid-fit, JAX's trainer holds the state apart from the variables
            for mirror in self._mirrors:
                mirror.pull()

    def after_restore(self) -> None:
        for mirror in self._mirrors:
            mirror.push()
