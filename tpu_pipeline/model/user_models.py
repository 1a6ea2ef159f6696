"""Models that are not ours: the user's function (`model.fn`) and keras.applications (`model.application`).

Both are built by `build_model` inside `strategy.scope()` and the dtype policy, then compiled
with the configured optimizer, schedule, precision and steps_per_execution, like the built-in
networks. The logits leave in float32 (a mixed-precision model's last layer would be bfloat16).

Your function is called as `fn(input_shape=..., num_classes=N)`, plus `task=...` ('classification'
or 'language_model') when it names a `task` parameter. `input_shape` is one example's shape
without the batch dimension, a list such as [32, 32, 3], or, when the batch is a dict of tensors
(a data.sequence batch), a dict {input name: shape}, e.g. {"tokens": [256], "tokens_segment_ids":
[256], "tokens_positions": [256]} (None for a length that varies per bucket); the model then takes
that dict, e.g. `inputs = {name: keras.Input(shape=shape, dtype="int32", name=name) for name, shape
in input_shape.items()}`.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
from types import ModuleType
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from tpu_pipeline.errors import ConfigError

ModelFn = Callable[..., Any]


def load_model_fn(spec: str) -> ModelFn:
    """'package.module:function' → the function; a ConfigError naming model.fn and the fix otherwise."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"model.fn={spec!r}: write it as 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(f"model.fn={spec!r}: cannot import module {module_name!r} ({error}); install it, or add its "
                          "directory to PYTHONPATH") from None
    fn = getattr(module, attribute, None)
    if not callable(fn):
        raise ConfigError(f"model.fn={spec!r}: module {module_name!r} has no function {attribute!r}")
    return fn


def call_model_fn(keras: ModuleType, fn: ModelFn, input_shape: Union[Sequence[Optional[int]], Mapping[str, Any]],
                  num_classes: int, where: str, task: Optional[str] = None) -> Any:
    """Calls fn(input_shape=..., num_classes=...) and checks that it returned a Keras model.

    `input_shape` is a list, or a dict {input name: shape list} for a dict batch (passed as a dict).
    `task` is passed only to a function that names a `task` parameter, so older functions keep working.
    """
    parameters = inspect.signature(fn).parameters
    accepts_any = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    missing = [name for name in ("input_shape", "num_classes") if name not in parameters and not accepts_any]
    if missing:
        raise ConfigError(f"{where}: the function must accept input_shape and num_classes keyword arguments "
                          f"(it lacks {', '.join(missing)}), e.g. def my_model(input_shape, num_classes): ...")
    if isinstance(input_shape, Mapping):
        shape: Any = {name: list(value) for name, value in input_shape.items()}
    else:
        shape = list(input_shape)
    extra = {"task": task} if task is not None and "task" in parameters else {}
    model = fn(input_shape=shape, num_classes=num_classes, **extra)
    if not isinstance(model, keras.Model):
        raise ConfigError(f"{where}: the function returned {type(model).__name__}, not a {keras.__name__}.Model "
                          f"(build it with {keras.__name__}, which model.keras selects)")
    return _float32_logits(keras, model)


def build_application(keras: ModuleType, name: str, weights: Optional[str], input_shape: Sequence[int],
                      num_classes: int) -> Any:
    """A keras.applications model with a logits head of `num_classes` (its own top when not pretrained)."""
    names = [n for n in dir(keras.applications) if n[:1].isupper()]
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; e.g. {', '.join(names[:6])}"
        raise ConfigError(f"model.application={name!r}: no such model in {keras.__name__}.applications{hint}")
    factory = getattr(keras.applications, name)
    shape = tuple(int(d) for d in input_shape)
    try:
        if weights is None:
            model = factory(input_shape=shape, weights=None, classes=num_classes, classifier_activation=None)
        else:
            base = factory(input_shape=shape, weights=weights, include_top=False, pooling="avg")
            outputs = keras.layers.Dense(num_classes, name="logits")(base.output)
            model = keras.Model(base.input, outputs, name=f"{name}_logits")
    except ValueError as error:
        raise ConfigError(f"model.application={name!r} with input_shape {list(shape)}: {error}") from None
    return _float32_logits(keras, model)


def _float32_logits(keras: ModuleType, model: Any) -> Any:
    """The model with its outputs cast to float32 when they are not (mixed precision): the loss needs them so."""
    if all(getattr(output, "dtype", "float32") == "float32" for output in model.outputs):
        return model
    outputs = keras.layers.Activation("linear", dtype="float32", name="logits_float32")(model.outputs[0])
    return keras.Model(model.inputs, outputs, name=model.name)
