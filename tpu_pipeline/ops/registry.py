"""A registry of named preprocessing ops, so configs can name them and users can add their own.

An op is registered as a *factory*: called with the op's config arguments, it returns an
`OpFn(features, seed) -> features` that runs inside a `tf.data` map. `seed` is a per-element
`int64[2]` stateless seed for random ops (None for deterministic ones), so augmentation is
reproducible, checkpointable with the iterator, and independent of thread scheduling.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Mapping, Optional

import tensorflow as tf

from tpu_pipeline.errors import ConfigError

Features = dict[str, Any]
OpFn = Callable[[Features, Optional[tf.Tensor]], Features]


@dataclasses.dataclass(frozen=True)
class RegisteredOp:
    """One registry entry: the factory, and whether its output depends on a random seed."""

    name: str
    factory: Callable[..., OpFn]
    random: bool
    batchable: bool = False  # works unchanged on a batch of features (lets the pipeline batch, then parse)

    def parameters(self) -> list[str]:
        return list(inspect.signature(self.factory).parameters)

    def build(self, kwargs: Mapping[str, Any], where: str = "") -> OpFn:
        """Calls the factory, turning bad or missing arguments into a ConfigError naming `where`."""
        signature = inspect.signature(self.factory)
        try:
            signature.bind(**kwargs)
        except TypeError as error:
            params = ", ".join(
                p.name + ("" if p.default is inspect.Parameter.empty else f"={p.default!r}")
                for p in signature.parameters.values()
            )
            raise ConfigError(
                f"{where or self.name}: bad arguments for op '{self.name}' ({error}); "
                f"its arguments are: {params}"
            ) from None
        try:
            return self.factory(**kwargs)
        except ConfigError as error:
            raise ConfigError(f"{where}: {error}" if where else str(error)) from None
        except (TypeError, ValueError) as error:
            raise ConfigError(f"{where or self.name}: op '{self.name}': {error}") from None


_REGISTRY: dict[str, RegisteredOp] = {}


def register_op(name: str, *, random: bool = False, batchable: bool = False, replace: bool = False) -> Callable:
    """Decorator: `@register_op("my_op")` makes a factory usable by name in configs.

    Mark ops whose output depends on randomness with `random=True`: the pipeline then passes them a
    per-element stateless seed, and refuses to cache their output (a cache would freeze it).
    Mark ops that work element-wise on a whole batch with `batchable=True`: when every op of a
    pipeline is, it batches serialized records first and parses and transforms whole batches
    (one thread crossing per batch instead of per record: ~10x faster for small records).
    """

    def decorator(factory: Callable[..., OpFn]) -> Callable[..., OpFn]:
        if name in _REGISTRY and not replace:
            raise ValueError(f"op '{name}' is already registered; pass replace=True to override it")
        _REGISTRY[name] = RegisteredOp(name=name, factory=factory, random=random, batchable=batchable)
        return factory

    return decorator


def get_op(name: str, where: str = "") -> RegisteredOp:
    """Looks an op up by name; an unknown name is a ConfigError that lists the known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"{where or 'op'}: unknown preprocessing op '{name}'; known ops: {', '.join(sorted(_REGISTRY))}. "
            "Register your own with @tpu_pipeline.register_op and import its module "
            "(config key 'imports')."
        ) from None


def registered_ops() -> list[str]:
    return sorted(_REGISTRY)
