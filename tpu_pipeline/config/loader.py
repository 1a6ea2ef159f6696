"""Reads a YAML config, applies `key=value` overrides on any key, and validates it strictly.

Overrides work like tensorflow/models' `--params_override`, but on dotted keys given as plain
command-line arguments: `data.batch_size=256 data.seed=3 data.preprocess.0.size=64`.
Values are parsed as YAML, so `true`, `[224, 224]` and `null` mean what they look like.
"""
from __future__ import annotations

import copy
import importlib
from typing import Any, Iterable, Mapping

import tensorflow as tf
import yaml

import pydantic

from tpu_pipeline.config.base import _models_in, validate
from tpu_pipeline.config.schema import Config
from tpu_pipeline.errors import ConfigError


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, line: int, first_line: int) -> None:
        super().__init__(f"key {key!r} appears twice (lines {first_line} and {line})")
        self.key, self.line, self.first_line = key, line, first_line


class _StrictLoader(yaml.SafeLoader):
    """safe_load, except that a repeated key in one mapping is an error: YAML keeps the last
    silently, so a second `batch_size:` further down would quietly win."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKey(key, line, seen[key])
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping)


def read_yaml(path: str) -> dict[str, Any]:
    """Reads a YAML mapping from a local path or any tf.io.gfile URL (gs://...)."""
    if not tf.io.gfile.exists(path):
        raise ConfigError(f"config file {path!r} does not exist; pass --config with a path to a YAML file")
    with tf.io.gfile.GFile(path, "r") as handle:
        try:
            loaded = yaml.load(handle.read(), Loader=_StrictLoader)
        except _DuplicateKey as error:
            raise ConfigError(f"config file {path!r}, line {error.line}: key {error.key!r} is already set on line "
                              f"{error.first_line}; keep one of them (YAML would silently use the last)") from None
        except yaml.YAMLError as error:
            raise ConfigError(f"config file {path!r} is not valid YAML: {error}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping of sections (data:, model:, ...)")
    return loaded


def apply_overrides(raw: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Returns a copy of `raw` with each `dotted.key=value` set; list items are addressed by index."""
    result = copy.deepcopy(dict(raw))
    for override in overrides:
        if "=" not in override:
            raise ConfigError(f"override {override!r} must look like key=value, e.g. data.batch_size=256")
        key, text = override.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"override {override!r}: empty part in key {key!r}")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError as error:
            raise ConfigError(f"override {override!r}: value is not valid YAML ({error})") from None
        node: Any = result
        for depth, part in enumerate(parts[:-1]):
            node = _child(node, part, ".".join(parts[: depth + 1]), override)
        _set(node, parts[-1], value, ".".join(parts[:-1]), override)
    return result


def _child(node: Any, part: str, where: str, override: str) -> Any:
    if isinstance(node, list):
        index = _index(node, part, where, override)
        return node[index]
    if not isinstance(node, dict):
        raise ConfigError(f"override {override!r}: {where!r} is a value, not a section")
    if node.get(part) is None:
        node[part] = {}
    return node[part]


def _set(node: Any, part: str, value: Any, parent: str, override: str) -> None:
    if isinstance(node, list):
        node[_index(node, part, f"{parent}.{part}", override)] = value
    elif isinstance(node, dict):
        node[part] = value
    else:
        raise ConfigError(f"override {override!r}: {parent!r} is a value, not a section")


def _index(node: list, part: str, where: str, override: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(f"override {override!r}: {where!r} needs a list index below {len(node)}")
    return int(part)


def import_modules(modules: Iterable[str]) -> None:
    """Imports user modules named in `imports:` so their @register_op ops exist before validation."""
    for index, name in enumerate(modules):
        try:
            importlib.import_module(name)
        except ImportError as error:
            raise ConfigError(
                f"imports[{index}]: cannot import module {name!r} ({error}); check it is installed "
                "or on PYTHONPATH"
            ) from None


def load_config(path: str | None = None, overrides: Iterable[str] = (), base: Mapping[str, Any] | None = None) -> Config:
    """YAML file (or `base` mapping) + overrides → a validated Config. Either source may be omitted."""
    raw: dict[str, Any] = dict(base or {})
    if path:
        raw.update(read_yaml(path))
    raw = apply_overrides(raw, overrides)
    imports = raw.get("imports") or []
    if isinstance(imports, list):
        import_modules(imports)
    return config_from_dict(raw)


def config_from_dict(raw: Mapping[str, Any]) -> Config:
    """Validates a plain mapping section by section, so each error names its own dotted key."""
    unknown = sorted(set(raw) - set(Config.model_fields))
    if unknown:
        raise ConfigError(
            f"unknown config section(s) {', '.join(unknown)}; allowed sections: {', '.join(Config.model_fields)}"
        )
    sections: dict[str, Any] = {}
    for name, value in raw.items():
        model = _models_in(Config.model_fields[name].annotation)
        is_model = isinstance(model, type) and issubclass(model, pydantic.BaseModel)
        sections[name] = validate(model, value, prefix=name) if is_model and value is not None else value
    return validate(Config, sections)
