"""`keyed`: write an op as a function of one tensor; the feature-dict plumbing is added for you.

In the spirit of big_vision's `InKeyOutKey`: the decorated factory's function takes one tensor
(and the per-element seed) and returns one tensor. The op gains two arguments: `key`, the feature
it reads, and `out_key`, the feature it writes (default: `key`, i.e. in place)::

    @register_op("resize", batchable=True)
    @keyed(default_key="image")
    def resize(size, method="bilinear"):
        height, width = size_pair(size, "resize")
        return lambda image, seed=None: tf.image.resize(image, [height, width], method=method)

    # configs: {op: resize, size: 224}  or  {op: resize, size: 224, key: mask, out_key: small_mask}
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops._util import feature
from tpu_pipeline.ops.autograph_rule import users_code

TensorFn = Callable[..., Any]  # (tensor, seed=None) -> tensor


def keyed(default_key: str, *, name: Optional[str] = None) -> Callable[[Callable[..., TensorFn]], Callable]:
    """Decorator for a factory whose function maps one tensor: adds `key` and `out_key` arguments.

    The decorated factory takes the factory's own arguments plus keyword-only `key` (default
    `default_key`) and `out_key` (default None: write back to `key`), and returns an op
    `fn(features, seed=None)` that reads `features[key]` (a missing feature is a ConfigError listing
    the features there), calls the tensor function with it and the seed, and returns
    `{**features, out_key: result}`. `name` names the op in that error (default: the factory's name).
    """

    def decorator(factory: Callable[..., TensorFn]) -> Callable:
        op_name = name or factory.__name__
        signature = inspect.signature(factory)
        taken = sorted({"key", "out_key"} & set(signature.parameters))
        if taken:
            raise TypeError(f"@keyed adds the arguments key and out_key; factory {op_name!r} already has {taken}")
        params = list(signature.parameters.values())
        # Keyword-only, before a **kwargs (the only place Python allows them there).
        at = len(params) - (1 if params and params[-1].kind is inspect.Parameter.VAR_KEYWORD else 0)
        params[at:at] = [
            inspect.Parameter("key", inspect.Parameter.KEYWORD_ONLY, default=default_key, annotation="str"),
            inspect.Parameter("out_key", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="Optional[str]"),
        ]
        keyed_signature = signature.replace(parameters=params)

        @functools.wraps(factory)
        def keyed_factory(*args: Any, **kwargs: Any):
            bound = keyed_signature.bind(*args, **kwargs)
            key = bound.arguments.pop("key", default_key)
            out_key = bound.arguments.pop("out_key", None)
            for arg, value in (("key", key), ("out_key", out_key)):
                if value is not None and not isinstance(value, str):
                    raise ConfigError(f"op '{op_name}': {arg} must be a feature name (a string), got {value!r}")
            target = key if out_key is None else out_key
            fn = users_code(factory(*bound.args, **bound.kwargs))

            def op(features, seed=None):
                return {**features, target: fn(feature(features, key, op_name), seed)}

            return op

        keyed_factory.__signature__ = keyed_signature  # what inspect.signature (and config checks) see
        return keyed_factory

    return decorator
