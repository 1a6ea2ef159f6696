"""A registry of named preprocessing ops, so configs can name them and users can add their own.

An op is registered as a *factory*: called with the op's config arguments, it returns an
`OpFn(features, seed) -> features` that runs inside a `tf.data` map. `seed` is a per-element
`int64[2]` stateless seed for random ops (None for deterministic ones), so augmentation is
reproducible, checkpointable with the iterator, and independent of thread scheduling.

A config is checked without calling any factory (`RegisteredOp.check` binds the arguments to the
factory's signature), so a factory may use TensorFlow freely: it is called only when a pipeline
is built (`RegisteredOp.build`), where it checks its argument values too.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
from typing import Any, Callable, Iterator, Mapping, Optional

import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops.autograph_rule import users_code

Features = dict[str, Any]
OpFn = Callable[[Features, Optional[tf.Tensor]], Features]


@dataclasses.dataclass(frozen=True)
class RegisteredOp:
    """One registry entry: the factory, and whether its output depends on a random seed."""

    name: str
    factory: Callable[..., OpFn]
    random: bool
    batchable: bool = False  # works unchanged on a batch of features (lets the pipeline batch, then parse)
    batch_level: bool = False  # mixes the examples of a batch: runs on each per-replica batch, after batching

    def parameters(self) -> list[str]:
        return list(inspect.signature(self.factory).parameters)

    def check(self, kwargs: Mapping[str, Any], where: str = "") -> None:
        """Checks the argument names against the factory's signature, without calling it.

        A missing or unknown argument is a ConfigError naming `where` and listing the arguments.
        Argument values are checked by the factory itself, when the pipeline is built.
        """
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

    def build(self, kwargs: Mapping[str, Any], where: str = "") -> OpFn:
        """Checks the arguments and calls the factory; bad values become a ConfigError naming `where`."""
        self.check(kwargs, where)
        try:
            return users_code(self.factory(**kwargs))
        except ConfigError as error:
            raise ConfigError(f"{where}: {error}" if where else str(error)) from None
        except (TypeError, ValueError, tf.errors.InvalidArgumentError) as error:
            message = getattr(error, "message", None) or str(error)  # a TF error's str() adds its op trace
            raise ConfigError(f"{where or self.name}: op '{self.name}': {message}") from None


_REGISTRY: dict[str, RegisteredOp] = {}


def register_op(name: str, *, random: bool = False, batchable: bool = False, batch_level: bool = False,
                replace: bool = False) -> Callable:
    """Decorator: `@register_op("my_op")` makes a factory usable by name in configs.

    Mark ops whose output depends on randomness with `random=True`: the pipeline then passes them a
    per-element stateless seed, and refuses to cache their output (a cache would freeze it).
    Mark ops that work element-wise on a whole batch with `batchable=True`: when every op of a
    pipeline is, it batches serialized records first and parses and transforms whole batches
    (one thread crossing per batch instead of per record: ~10x faster for small records).
    Mark ops that combine the examples of a batch (mixup, CutMix) with `batch_level=True`: they come after
    the single-example ops of `data.augment` (only batchable ops may follow them), and run on each
    per-replica batch once it is made, with a seed per batch.
    The factory is called only when a pipeline is built, so it may run TensorFlow ops.
    """

    def decorator(factory: Callable[..., OpFn]) -> Callable[..., OpFn]:
        if name in _REGISTRY and not replace:
            raise ValueError(f"op '{name}' is already registered; pass replace=True to override it")
        _REGISTRY[name] = RegisteredOp(name=name, factory=factory, random=random, batchable=batchable,
                                       batch_level=batch_level)
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


@contextlib.contextmanager
def scoped_ops() -> Iterator[None]:
    """Ops registered inside `with scoped_ops():` are gone after it, and ops they replaced come back.

    For tests: a test's `@register_op` does not leak into the next test.
    """
    saved = dict(_REGISTRY)
    try:
        yield
    finally:
        _REGISTRY.clear()
        _REGISTRY.update(saved)
