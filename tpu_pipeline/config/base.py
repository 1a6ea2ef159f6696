"""Strict config models and readable validation errors.

Every config section derives from `StrictModel`: unknown keys are errors (big_vision's silently
ignored keys are the bug we avoid), values are checked on assignment too, and a pydantic
`ValidationError` is turned into a `ConfigError` whose lines name the dotted key, what was given
and what is allowed.
"""
from __future__ import annotations

import types
import typing
from typing import Any, Iterable, NamedTuple, Optional

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
    error: pydantic.ValidationError, model: type[pydantic.BaseModel], prefix: str = "", data: Any = None
) -> str:
    """One line per problem, in the config's words: `key=given: must be ...`, the allowed keys for a
    typo. A value that matches no member of a union (`length: -5` for `int > 0 or {key: int > 0}`)
    is one line naming every accepted form, not one line of validator internals per member."""
    lines: dict[str, str] = {}
    for item in error.errors():
        loc = [p for p in item["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        found = _locate(model, loc)
        path = found.path if found.union_at is None else found.path[:found.union_at]
        key = ".".join(([prefix] if prefix else []) + path) or "<root>"
        if found.union_at is not None:
            if key not in lines:
                given = _lookup(data, path, item.get("input"))
                accepted = _describe(found.union, found.union_metadata)
                lines[key] = (f"{key}={_show(given)}: must be {accepted}" if accepted
                              else f"{key}: {item['msg']} (given: {_show(given)})")
            continue
        kind = item["type"]
        if kind == "extra_forbidden":
            parent = _locate(model, loc[:-1]).annotation
            allowed = sorted(parent.model_fields) if _is_model(parent) else []
            line = f"{key}: unknown key" + (f"; allowed keys here: {', '.join(allowed)}" if allowed else "")
        elif kind == "missing":
            line = f"{key}: required, and not given"
        elif kind in _TYPE_ERRORS and _describe(found.annotation, found.metadata):
            line = f"{key}={_show(item.get('input'))}: must be {_describe(found.annotation, found.metadata)}"
        else:
            message = item["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
            given = item.get("input")
            line = f"{key}: {message}" + ("" if isinstance(given, dict) or "input" not in item else f" (given: {_show(given)})")
        lines.setdefault(f"{key}\0{len(lines)}", line)
    shown = list(lines.values())
    return shown[0] if len(shown) == 1 else "invalid config:\n" + "\n".join(f"  {line}" for line in shown)


# pydantic error types that mean "not of the field's type or range": said as the type the field takes.
_TYPE_ERRORS = {
    "int_type", "int_parsing", "int_from_float", "float_type", "float_parsing", "bool_type", "bool_parsing",
    "string_type", "list_type", "tuple_type", "dict_type", "model_type", "model_attributes_type", "literal_error",
    "greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number", "enum",
}


class _Located(NamedTuple):
    path: list[str]  # the dotted key as the user wrote it (union tags left out)
    annotation: Any  # what the key takes, where known
    metadata: list  # its constraints (Gt, Ge, ... of a constrained number)
    union_at: Optional[int]  # where a union starts in `path`: its errors are one line
    union: Any
    union_metadata: list


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel)


def _members(annotation: Any) -> Optional[list]:
    """A union's members (None left out), or None when `annotation` is not a union."""
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return None
    return [a for a in typing.get_args(annotation) if a is not type(None)]


def _unwrap(annotation: Any, metadata: list) -> tuple[Any, list]:
    """Optional[X] → X, Annotated[X, constraints] → X with the constraints added to `metadata`."""
    while True:
        members = _members(annotation)
        if members is not None and len(members) == 1:
            annotation = members[0]
        elif typing.get_origin(annotation) is typing.Annotated:
            metadata = [*metadata, *(m for m in annotation.__metadata__ if m is not None)]
            annotation = typing.get_args(annotation)[0]
        else:
            return annotation, metadata


def _locate(model: type[pydantic.BaseModel], loc: Iterable[Any]) -> _Located:
    """Follows an error location down the annotations of nested models, lists and dicts.

    Discriminated-union tags (a source's 'tfrecord') pick their model and are left out of the path;
    any other union ends the walk (its member tags, such as 'constrained-int', are pydantic's)."""
    annotation: Any = model
    metadata: list = []
    path: list[str] = []
    for part in loc:
        annotation, metadata = _unwrap(annotation, metadata)
        members = _members(annotation)
        if members is not None or _fixed_tuple(annotation):  # a union, or [a, b]: one line for the whole value
            tagged = [m for m in members or [] if _is_model(m) and "type" in m.model_fields and m.model_fields["type"].default == part]
            if members and tagged:
                annotation, metadata = tagged[0], []
                continue
            return _Located(path, None, [], len(path), annotation, metadata)
        path.append(str(part))
        if _is_model(annotation):
            field = annotation.model_fields.get(str(part))
            annotation, metadata = (field.annotation, list(field.metadata)) if field is not None else (None, [])
        elif typing.get_origin(annotation) is dict:
            annotation, metadata = typing.get_args(annotation)[1], []
        elif typing.get_origin(annotation) in (list, tuple):
            args = typing.get_args(annotation)
            annotation, metadata = (args[0] if args else None), []
        else:
            annotation, metadata = None, []
    annotation, metadata = _unwrap(annotation, metadata)
    if _members(annotation) is not None and not all(_is_model(m) for m in _members(annotation)):
        return _Located(path, annotation, metadata, len(path), annotation, metadata)
    return _Located(path, annotation, metadata, None, None, [])


def _fixed_tuple(annotation: Any) -> bool:
    args = typing.get_args(annotation)
    return typing.get_origin(annotation) is tuple and not (len(args) == 2 and args[1] is Ellipsis)


def _lookup(data: Any, path: list[str], default: Any) -> Any:
    """The value at `path` in the data as given (the union's whole value, not a member's piece of it)."""
    node = data
    for part in path:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, pydantic.BaseModel) and hasattr(node, part):
            node = getattr(node, part)
        else:
            return default
    return node


def _show(value: Any) -> str:
    """A given value as a user would type it: null, true, 'text', [1, 2]."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _join(alternatives: list[str]) -> str:
    return alternatives[0] if len(alternatives) == 1 else ", ".join(alternatives[:-1]) + " or " + alternatives[-1]


def _describe(annotation: Any, metadata: Iterable[Any] = ()) -> Optional[str]:
    """What a key takes, in words: 'a positive integer or {key: positive integer}'; None when unsure."""
    alternatives = _alternatives(annotation, list(metadata))
    return _join(alternatives) if alternatives else None


def _alternatives(annotation: Any, metadata: list, plural: bool = False) -> Optional[list[str]]:
    annotation, metadata = _unwrap(annotation, metadata)
    members = _members(annotation)
    if members is not None:
        parts = [_alternatives(m, [], plural) for m in members]
        if any(p is None for p in parts):
            return None
        flat = [a for p in parts for a in p]
        if type(None) in typing.get_args(annotation):
            flat.append("null")
        return flat
    if typing.get_origin(annotation) is typing.Literal:
        return [_show(v) for v in typing.get_args(annotation)]
    if annotation is type(None):
        return ["null"]
    if annotation is bool:
        return ["true", "false"]
    if annotation is str:
        return ["strings" if plural else "a string"]
    if annotation in (int, float):
        return [_number("integer" if annotation is int else "number", metadata, plural)]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple):
        fixed = origin is tuple and not (len(args) == 2 and args[1] is Ellipsis)
        inner = _alternatives(args[0], [], plural=True) if args else ["items"]
        if inner is None or len(inner) != 1:
            return None
        return [f"a list of {len(args)} {inner[0]}" if fixed else f"a list of {inner[0]}"]
    if origin is dict:
        inner = _alternatives(args[1], []) if args else None
        if inner is None or len(inner) != 1:
            return ["a mapping"]
        value = inner[0].removeprefix("a ").removeprefix("an ")
        return ["{key: " + value + "}"]
    if _is_model(annotation):
        return [f"a mapping of its keys ({', '.join(annotation.model_fields)})"]
    return None


def _number(noun: str, metadata: list, plural: bool) -> str:
    """'a positive integer', 'numbers of at least 0 and below 1' from Gt/Ge/Lt/Le constraints."""
    bounds = {name: getattr(m, name) for m in metadata for name in ("gt", "ge", "lt", "le")
              if getattr(m, name, None) is not None}
    words = noun + "s" if plural else noun
    if set(bounds) == {"gt"} and bounds["gt"] == 0:
        words = "positive " + words
    elif set(bounds) == {"ge"} and bounds["ge"] == 0:
        words = "non-negative " + words
    else:
        limits = [f"{said} {bounds[name]:g}" for name, said in (("gt", "above"), ("ge", "at least"),
                                                               ("lt", "below"), ("le", "at most")) if name in bounds]
        words += (" of " + " and ".join(limits)) if limits else ""
    if plural:
        return words
    return ("an " if words[0] in "aeiou" else "a ") + words


def validate(model: type[pydantic.BaseModel], data: Any, prefix: str = ""):
    """Builds `model` from plain data, raising ConfigError with dotted keys on any problem."""
    try:
        return model.model_validate(data, context={"prefix": prefix})
    except pydantic.ValidationError as error:
        raise ConfigError(format_validation_error(error, model, prefix, data)) from None
