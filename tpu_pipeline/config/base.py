"""Strict config models and readable validation errors.

Every config section derives from `StrictModel`: unknown keys are errors (big_vision's silently
ignored keys are the bug we avoid), values are checked on assignment too, and a pydantic
`ValidationError` is turned into a `ConfigError` whose lines name the dotted key, what was given
and what is allowed.
"""
from __future__ import annotations

from typing import Any, Iterable

import pydantic

from tpu_pipeline.errors import ConfigError


class StrictModel(pydantic.BaseModel):
    """Base for every config section: no unknown keys, no silent coercion of wrong types."""

    model_config = pydantic.ConfigDict(
        extra="forbid",
        validate_assignment=True,
        frozen=False,
        populate_by_name=True,
    )


def _walk(model: type[pydantic.BaseModel], loc: Iterable[Any]) -> tuple[list[str], Any]:
    """Follows an error location down nested models.

    Returns the location as the user wrote it (discriminated-union tags such as 'tfrecord' removed)
    and the model class reached at its end (None when the location leaves the models).
    """
    current: Any = model
    path: list[str] = []
    for part in loc:
        if isinstance(current, list):  # a union of models: this part is the discriminator tag
            current = next((m for m in current if m.model_fields.get("type") and m.model_fields["type"].default == part), None)
            continue
        path.append(str(part))
        if isinstance(current, type) and issubclass(current, pydantic.BaseModel):
            field = current.model_fields.get(str(part))
            current = _models_in(field.annotation) if field is not None else None
        else:
            current = None
    return path, current if isinstance(current, type) else None


def _models_in(annotation: Any) -> Any:
    """The model inside an annotation: a class, a list of classes for a union of models, or None."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    args = getattr(annotation, "__args__", ()) or ()
    models = [a for a in args if isinstance(a, type) and issubclass(a, pydantic.BaseModel)]
    if len(models) == 1:
        return models[0]
    return models or None


def format_validation_error(
    error: pydantic.ValidationError, model: type[pydantic.BaseModel], prefix: str = ""
) -> str:
    """One line per problem: `key: what is wrong (given: value)`, with the allowed keys for typos."""
    lines = []
    for item in error.errors():
        loc = [p for p in item["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        path, _ = _walk(model, loc)
        key = ".".join(([prefix] if prefix else []) + path) or "<root>"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            _, parent = _walk(model, loc[:-1])
            allowed = sorted(parent.model_fields) if parent else []
            message = "unknown key" + (f"; allowed keys here: {', '.join(allowed)}" if allowed else "")
        elif "input" in item and item["type"] != "missing":
            message += f" (given: {item['input']!r})"
        lines.append(f"  {key}: {message}")
    return "invalid config:\n" + "\n".join(lines)


def validate(model: type[pydantic.BaseModel], data: Any, prefix: str = ""):
    """Builds `model` from plain data, raising ConfigError with dotted keys on any problem."""
    try:
        return model.model_validate(data, context={"prefix": prefix})
    except pydantic.ValidationError as error:
        raise ConfigError(format_validation_error(error, model, prefix)) from None
