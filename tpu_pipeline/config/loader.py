"""Reads a YAML config, applies `key=value` overrides on any key, and validates it strictly.

Overrides work like tensorflow/models' `--params_override`, but on dotted keys given as plain
command-line arguments: `data.batch_size=256 data.seed=3 data.preprocess.0.size=64`.
Values are parsed as YAML, so `true`, `[224, 224]` and `null` mean what they look like.
"""
from __future__ import annotations

import copy
import importlib
import os
from typing import Any, Iterable, Mapping, Sequence

import yaml

import pydantic

from tpu_pipeline.config.base import _models_in, validate
from tpu_pipeline.config.schema import Config, follow_train_sequence, unset_followed
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.system import path_exists, path_is_dir, read_text


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
    """Reads a YAML mapping from a local path or any tf.io.gfile URL (gs://...); a local one starts no TensorFlow."""
    if not path_exists(path):
        raise ConfigError(f"config file {path!r} does not exist; pass --config with a path to a YAML file")
    if path_is_dir(path):
        raise ConfigError(f"config file {path!r} is a directory; pass --config with a path to a YAML file")
    try:
        loaded = yaml.load(read_text(path), Loader=_StrictLoader)
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


# Keys whose values are input paths: relative ones resolve against the directory of the config
# file that sets them (a config travels with its data). Outputs (train.run_dir) and command-line
# overrides stay relative to the working directory.
_INPUT_PATHS = (("source", "files"), ("source", "dir"), ("source", "path"), ("source", "data_dir"), ("cache", "path"))


def _resolved(value: Any, base_dir: str) -> Any:
    def one(path: str) -> str:
        path = path.strip()
        if not path or "://" in path or os.path.isabs(path) or path.startswith(("~", "$")):
            return path
        return os.path.normpath(os.path.join(base_dir, path))

    if isinstance(value, list):
        return [one(v) if isinstance(v, str) else v for v in value]
    if isinstance(value, str):
        return ",".join(one(part) for part in value.split(",")) if "," in value else one(value)
    return value


def resolve_input_paths(raw: dict[str, Any], base_dir: str) -> dict[str, Any]:
    """`raw` with the relative input paths of its data sections resolved against `base_dir`."""
    for section in ("data", "eval_data"):
        data = raw.get(section)
        if not isinstance(data, dict):
            continue
        mixed = (data.get("mixture") or {}).get("sources") if isinstance(data.get("mixture"), dict) else None
        for holder in [data] + [entry for entry in mixed or [] if isinstance(entry, dict)]:
            for parent, key in _INPUT_PATHS:
                node = holder.get(parent)
                if isinstance(node, dict) and key in node:
                    node[key] = _resolved(node[key], base_dir)
    return raw


# A tfrecord source reads `files` or a converted `dir` (with its `split`), never both: a later layer (a
# file over another, --params_override, a key=value override) that sets one replaces what an earlier
# layer set of the other, so switching a config between them is one override.
SOURCE_KINDS = {"files": ("dir", "split"), "dir": ("files",)}


def _switch_source(source: dict[str, Any], layer: Mapping[str, Any]) -> None:
    """Removes from `source` (a `source:` mapping of earlier layers) what the keys `layer` sets replace."""
    for key, replaced in SOURCE_KINDS.items():
        if (layer.get(key) is not None and source.get(key) is None and source.get(replaced[0]) is not None
                and replaced[0] not in layer):
            for other in replaced:
                if other not in layer:
                    source.pop(other, None)


def merge(base: Mapping[str, Any], layer: Mapping[str, Any]) -> dict[str, Any]:
    """`layer` over `base`: mappings merge key by key (later wins), anything else is replaced; a `source`
    that switches between `files` and `dir` drops the other (`SOURCE_KINDS`)."""
    result = copy.deepcopy(dict(base))
    for key, value in layer.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            if key == "source":
                _switch_source(result[key], value)
            result[key] = merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def read_layered(paths: Sequence[str]) -> dict[str, Any]:
    """Several config files, each over the ones before (later wins), input paths resolved per file."""
    raw: dict[str, Any] = {}
    for path in paths:
        layer = read_yaml(path)
        if "://" not in path:
            layer = resolve_input_paths(layer, os.path.dirname(os.path.abspath(os.path.expanduser(path))))
        raw = merge(raw, layer)
    return raw


def params_override(text: str) -> dict[str, Any]:
    """tensorflow/models' --params_override: a YAML mapping given inline, or the path of a YAML file."""
    if text.strip().endswith((".yaml", ".yml")) and path_exists(text.strip()):
        return read_yaml(text.strip())
    try:
        loaded = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as error:
        raise ConfigError(f"--params_override: not a YAML mapping or a .yaml file ({error})") from None
    if not isinstance(loaded, dict):
        raise ConfigError("--params_override: give a YAML mapping, e.g. --params_override='train: {epochs: 3}', "
                          "or the path of a .yaml file")
    return loaded


def apply_overrides(raw: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Returns a copy of `raw` with each `dotted.key=value` set; list items are addressed by index."""
    result = copy.deepcopy(dict(raw))
    typed: dict[str, Any] = {}  # key → value, of these overrides: a source's switch keeps what they set
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
        if len(parts) > 1 and parts[-2] == "source" and parts[-1] in SOURCE_KINDS and isinstance(node, dict):
            parent = ".".join(parts[:-1])
            _switch_source(node, {parts[-1]: value, **{key.rsplit(".", 1)[1]: typed[key] for key in typed
                                                       if key.rsplit(".", 1)[0] == parent}})
        _set(node, parts[-1], value, ".".join(parts[:-1]), override)
        typed[".".join(parts)] = value
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


def load_config(path: str | Sequence[str] | None = None, overrides: Iterable[str] = (),
                base: Mapping[str, Any] | None = None) -> Config:
    """YAML file(s) (each over the ones before; or a `base` mapping) + overrides → a validated
    Config. Either source may be omitted. Relative input paths resolve against each file's directory."""
    raw: dict[str, Any] = dict(base or {})
    if path:
        raw = merge(raw, read_layered([path] if isinstance(path, str) else list(path)))
    raw = apply_overrides(raw, overrides)
    imports = raw.get("imports") or []
    if isinstance(imports, list):
        import_modules(imports)
    return config_from_dict(raw)


def config_from_dict(raw: Mapping[str, Any]) -> Config:
    """Validates a plain mapping section by section, so each error names its own dotted key.
    eval_data.sequence follows data.sequence where it sets nothing (schema.follow_train_sequence)."""
    unknown = sorted(set(raw) - set(Config.model_fields))
    if unknown:
        raise ConfigError(
            f"unknown config section(s) {', '.join(unknown)}; allowed sections: {', '.join(Config.model_fields)}"
        )
    sections: dict[str, Any] = {}
    for name, value in follow_train_sequence(raw).items():
        model = _models_in(Config.model_fields[name].annotation)
        is_model = isinstance(model, type) and issubclass(model, pydantic.BaseModel)
        sections[name] = validate(model, value, prefix=name) if is_model and value is not None else value
    config = validate(Config, sections)
    unset_followed(raw, config)
    return config


def config_keys(model: Any = None, prefix: str = "") -> list[str]:
    """Every dotted key of the config schema (the union members of a section included), for
    suggestions such as `--epochs 3` → `train.epochs=3`."""
    model = Config if model is None else model
    keys: list[str] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        inner = _models_in(field.annotation)
        members = inner if isinstance(inner, list) else [inner] if inner is not None else []
        if not members:
            keys.append(key)
        for member in members:
            keys.extend(k for k in config_keys(member, key + ".") if k not in keys)
    return keys


def suggest_config_key(flag: str, value: str | None = None) -> str | None:
    """For an unknown `--flag`: the config key(s) ending with that name, as `key=value` to type."""
    name = flag.lstrip("-").split("=", 1)[0].replace("-", "_")
    matches = [key for key in config_keys() if key.split(".")[-1] == name]
    if not matches:
        return None
    shown = value if value is not None else "VALUE"
    return " or ".join(f"{key}={shown}" for key in matches[:3])

