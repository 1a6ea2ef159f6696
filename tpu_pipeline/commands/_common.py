"""Helpers shared by the subcommands: config loading with the demo data wired in."""
from __future__ import annotations

import os
from typing import Any, Sequence

from absl import flags

from tpu_pipeline.config import Config, config_from_dict
from tpu_pipeline.config.loader import apply_overrides, import_modules, merge, params_override, read_layered, read_yaml
from tpu_pipeline.demo import DEMO_CONFIG, demo_overrides, ensure_builtin_data
from tpu_pipeline.ops import check_ops

# One definition for the commands that share the flag (convert, verify): a process (a test, a notebook)
# may import both, and absl refuses a flag defined twice.
flags.DEFINE_integer("workers", 0, "threads that work at once: convert's readers and encoders, verify's files "
                     "checked (0 = one per core)")
FLAGS = flags.FLAGS


def load_raw(overrides: Sequence[str], check_accelerator: bool = False) -> tuple[dict[str, Any], Config]:
    """(the plain mapping, the validated Config): --config FILE(s), layered, then --params_override, then
    key=value overrides; without --config, the demo config on the demo data.

    The ops of `data` and `eval_data` are checked too (names and arguments), before any work starts; with
    `check_accelerator` (train, doctor), so is a TPU of this machine that this TensorFlow cannot drive.
    """
    if check_accelerator:  # before the demo data is written: its cluster section is the config's and overrides'
        base = read_layered([FLAGS.config] if isinstance(FLAGS.config, str) else list(FLAGS.config)) \
            if FLAGS.config else read_yaml(DEMO_CONFIG)
        if FLAGS.params_override:
            base = merge(base, params_override(FLAGS.params_override))
        _check_accelerator(apply_overrides(base, overrides))
    if FLAGS.config:
        paths = [FLAGS.config] if isinstance(FLAGS.config, str) else list(FLAGS.config)  # one path set from Python
        raw = read_layered(paths)
    else:
        raw = apply_overrides(read_yaml(DEMO_CONFIG), demo_overrides())
    if FLAGS.params_override:
        raw = merge(raw, params_override(FLAGS.params_override))
    raw = apply_overrides(raw, overrides)
    import_modules(raw.get("imports") or [])
    ensure_builtin_data(raw)
    config = config_from_dict(raw)
    check_ops(config.data, "data")
    check_ops(config.eval_data, "eval_data")
    return raw, config


def load(overrides: Sequence[str], check_accelerator: bool = False) -> Config:
    """--config FILE + overrides; without --config, the built-in demo config on the demo data."""
    return load_raw(overrides, check_accelerator)[1]


def _check_accelerator(raw: dict[str, Any]) -> None:
    """The resolver's dead end (a TPU here this TensorFlow cannot drive) before the demo data is written or a
    pipeline measured, and the CPU split into cluster.cpu_replicas devices before the demo's first TensorFlow
    op. A malformed `cluster` section is left to the config's own one-line error."""
    from pydantic import ValidationError

    from tpu_pipeline.cluster.resolver import check_tpu_stack, split_cpu_early
    from tpu_pipeline.config.cluster import ClusterConfig

    model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
    variable = os.environ.get("KERAS_BACKEND", "").strip().lower()
    if model.get("framework", "jax" if variable == "jax" else None) == "jax":
        return  # JAX drives the TPU (jax[tpu]); TensorFlow only makes the input, on the host's CPU
    try:
        cluster = ClusterConfig.model_validate(raw.get("cluster") or {})
    except ValidationError:
        return
    check_tpu_stack(cluster)
    split_cpu_early(cluster)
