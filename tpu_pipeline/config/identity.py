"""What a run directory was started with: the config keys a checkpoint only means something with.

`train` saves these keys' values in every checkpoint and compares them when it resumes
(docs/training.md, "What a run directory remembers"). A key that differs is refused in one line,
unless `train.allow_changes` names it (or a section above it, such as `data`):

- the training data: `data.source` (its type and where it reads: files, dir, split; a TFDS name,
  data_dir and split; an arrays path) or `data.mixture.sources` (names and where each reads, in order;
  their weights are free);
- the sequence shape: `data.sequence.keys`, `.length`, `.mode` (or none);
- the global batch: `data.batch_size`. The input position of a resumed run is its step × the global
  batch, and train.steps_per_epoch (by default) and the learning-rate schedule's length are counted in
  such steps. Accepted by train.allow_changes, the run goes on by examples trained: its step is rebased
  to them (`train/batch_change.py`);
- the model: `model.framework` when it is jax (a JAX checkpoint holds its weights by Keras 3 path), `model.keras`, what builds it (`model.architecture` and its section's shape keys, or
  `model.fn`, or `model.application`), `model.optimizer.name` (its slots are in the checkpoint);
- the task and its width: `train.task`, `train.num_classes`.

Everything else may change on resume: logging, checkpoint cadence, `train.epochs` (more epochs then
run), `train.steps_per_epoch`, evaluation (`eval_data`, `train.eval_*`), a mixture's weights, the
learning rate and schedule, dropout, precision, the cluster, and the knobs that set the input's speed
or order (`data.seed`, shuffle, parse, caches, tf.data options: the run goes on at its step of that order).
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Optional

# The shape keys of each architecture's section (dropout is free: it changes no weight).
_ARCHITECTURE_KEYS = {
    "mlp": ("hidden_units",),
    "cnn": ("filters",),
    "resnet": ("blocks_per_stage", "width", "block", "stem"),
    "transformer": ("width", "depth", "heads", "mlp_dim", "tie_embeddings", "vocab_size", "max_length",
                    "tokens_key", "causal", "pooling"),
}
# Where each kind of source reads.
_SOURCE_KEYS = {"tfrecord": ("files", "dir", "split"), "tfds": ("name", "data_dir", "split"), "arrays": ("path",)}

# Every key `run_identity` may name: what `train.allow_changes` accepts (each, or a section above it).
IDENTITY_KEYS: tuple[str, ...] = (
    "data.source.type",
    *sorted({f"data.source.{key}" for keys in _SOURCE_KEYS.values() for key in keys}),
    "data.mixture.sources",
    "data.sequence.keys", "data.sequence.length", "data.sequence.mode",
    "data.batch_size",
    "model.framework", "model.keras", "model.architecture", "model.fn", "model.application",
    *(f"model.{name}.{key}" for name, keys in _ARCHITECTURE_KEYS.items() for key in keys),
    "model.optimizer.name",
    "train.task", "train.num_classes",
)


def _path(value: Optional[str]) -> Optional[str]:
    """A local path made absolute (a run started from another directory names the same files); a URL as given."""
    if value is None or "://" in value:
        return value
    return os.path.abspath(os.path.expanduser(value))


def _files(value: Any) -> Optional[list[str]]:
    if value is None:
        return None
    patterns = value.split(",") if isinstance(value, str) else list(value)
    return [_path(p.strip()) for p in patterns if p.strip()]


def _source(source: Any) -> dict[str, Any]:
    """Where one source reads, its keys as the config names them (split: the one read, `train` by default)."""
    found: dict[str, Any] = {"type": source.type}
    for key in _SOURCE_KEYS[source.type]:
        value = getattr(source, key)
        if key == "files":
            value = _files(value)
        elif key in ("dir", "data_dir", "path"):
            value = _path(value)
        elif key == "split" and source.type == "tfrecord" and value is None and source.dir is not None:
            value = "train"
        found[key] = value
    return found


def run_identity(config: Any) -> dict[str, Any]:
    """{dotted key: plain value} of the keys a resumed run must keep (see the module's docstring)."""
    identity: dict[str, Any] = {}
    data = config.data
    if data.source is not None:
        identity.update({f"data.source.{key}": value for key, value in _source(data.source).items()})
    else:
        identity["data.mixture.sources"] = [
            {"name": entry.name, **{k: v for k, v in _source(entry.source).items() if k != "type"}}
            for entry in data.mixture.sources
        ]
    sequence = data.sequence
    for key in ("keys", "length", "mode"):
        identity[f"data.sequence.{key}"] = None if sequence is None else getattr(sequence, key)
    identity["data.batch_size"] = data.batch_size
    model = config.model
    if model.framework == "jax":  # absent on TensorFlow, as in every run directory started before JAX
        identity["model.framework"] = model.framework
    identity["model.keras"] = model.keras
    if model.fn is not None:
        identity["model.fn"] = model.fn
    elif model.application is not None:
        identity["model.application"] = model.application
    else:
        identity["model.architecture"] = model.architecture
        section = getattr(model, model.architecture)
        for key in _ARCHITECTURE_KEYS[model.architecture]:
            value = getattr(section, key)
            identity[f"model.{model.architecture}.{key}"] = list(value) if isinstance(value, tuple) else value
    identity["model.optimizer.name"] = model.optimizer.name
    identity["train.task"] = config.train.task
    identity["train.num_classes"] = config.train.num_classes
    return identity


def accepts(allowed: Iterable[str], key: str) -> bool:
    """Whether `train.allow_changes` (`allowed`) names `key` or a section above it."""
    return any(key == entry or key.startswith(entry + ".") for entry in allowed)


def check_allowed_names(allowed: Iterable[str]) -> Optional[str]:
    """The first entry of `train.allow_changes` that names no compared key nor a section of them, or None."""
    for entry in allowed:
        if not any(accepts([entry], key) for key in IDENTITY_KEYS):
            return entry
    return None


def differences(saved: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, saved value, current value) of every compared key that differs; a key one side lacks is None there."""
    keys = list(saved) + [key for key in current if key not in saved]
    return [(key, saved.get(key), current.get(key)) for key in keys if saved.get(key) != current.get(key)]


def show(value: Any) -> str:
    """A value as a user would type it, cut to one short phrase."""
    if value is None:
        text = "unset"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        text = "[" + ", ".join(f"{v['name']}: {v.get('dir') or v.get('files')}" for v in value) + "]"
    elif isinstance(value, str):
        text = repr(value)
    else:
        text = str(value)
    return text if len(text) <= 100 else text[:97] + "..."
