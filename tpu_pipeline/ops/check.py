"""Checking and building the ops a data config names.

`check_ops` is the op half of config validation (the config layer imports no ops): names,
argument names, and ops that must not run before the cache. It calls no factory, so it runs no
TensorFlow op and is cheap; the factories run, and check their argument values, in `build_ops`
when a pipeline is built.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops.registry import OpFn, get_op

if TYPE_CHECKING:
    from tpu_pipeline.config.data import DataConfig, OpConfig

SECTIONS = ("preprocess", "augment")


def check_ops(data: Optional["DataConfig"], prefix: str = "data") -> None:
    """Checks every op of `data.preprocess` and `data.augment` without calling its factory.

    Raises a ConfigError naming `{prefix}.preprocess[i]` (or augment) for an unknown op, a missing
    or unknown argument, a random op in preprocess while `{prefix}.cache` is enabled, or a batch-level op
    (mixup, CutMix) outside a training pipeline's augment or followed by an op that works on single examples.
    None passes.
    """
    if data is None:
        return
    for section in SECTIONS:
        for index, op in enumerate(getattr(data, section)):
            where = f"{prefix}.{section}[{index}]"
            registered = get_op(op.op, where)
            registered.check(op.args, where)
            _check_batch_level(data, section, index, registered, where, prefix)
            if section == "preprocess" and registered.random and data.cache.enabled:
                raise ConfigError(
                    f"{where}: op '{op.op}' is random and runs before {prefix}.cache, so the cache "
                    f"would freeze one draw for every epoch. Move it to {prefix}.augment (which runs "
                    f"after the cache) or set {prefix}.cache.enabled=false."
                )
    for source_index, entry in enumerate(data.mixture.sources if getattr(data, "mixture", None) is not None else []):
        for index, op in enumerate(entry.preprocess):
            where = f"{prefix}.mixture.sources[{source_index}].preprocess[{index}]"
            registered = get_op(op.op, where)
            registered.check(op.args, where)
            if registered.random:
                raise ConfigError(
                    f"{where}: op '{op.op}' is random; a source's own ops must be deterministic (they bring its "
                    f"records to the mixture's shape): move it to {prefix}.augment, which runs on every source")


def _check_batch_level(data: "DataConfig", section: str, index: int, registered, where: str, prefix: str) -> None:
    """A batch-level op mixes a batch's examples: only in a training pipeline's augment, followed only by ops
    that work on whole batches (they run on the mixed batch)."""
    if registered.batch_level:
        name = registered.name
        if prefix.startswith("eval_data"):
            raise ConfigError(f"{where}: op '{name}' mixes examples and their labels, which an evaluation must "
                              f"never do (its figures would not be the model's); remove it from {prefix}")
        if section != "augment":
            raise ConfigError(f"{where}: op '{name}' works on whole batches; move it to the end of {prefix}.augment")
        if getattr(data, "sequence", None) is not None:
            raise ConfigError(f"{where}: op '{name}' mixes images and class labels, not token sequences; "
                              f"remove it or {prefix}.sequence")
        return
    if section == "augment" and not registered.batchable and any(
            get_op(op.op, where).batch_level for op in data.augment[:index]):
        raise ConfigError(f"{where}: op '{data.augment[index].op}' works on single examples but comes after a "
                          f"batch-level op (mixup_cutmix runs on whole batches); put it before the batch-level op "
                          f"(ops that work on batches, such as cast, may follow it)")


def build_ops(ops: Sequence["OpConfig"], where: str = "data.preprocess", first: int = 0) -> tuple[list[OpFn], list[bool]]:
    """Calls each op's factory: (the op functions, whether each is random).

    `where` is the ops' config key and `first` the index of `ops[0]` there; a bad argument value is a
    ConfigError naming `{where}[i]`.
    """
    registered = [get_op(op.op, f"{where}[{first + index}]") for index, op in enumerate(ops)]
    fns = [r.build(op.args, f"{where}[{first + index}]") for index, (r, op) in enumerate(zip(registered, ops))]
    return fns, [r.random for r in registered]


def split_batch_level(ops: Sequence["OpConfig"]) -> tuple[list["OpConfig"], list["OpConfig"]]:
    """(the ops that run on single examples, the ops from the first batch-level one on, which run on
    batches): `check_ops` lets only batchable ops follow a batch-level one."""
    ops = list(ops)
    first = next((index for index, op in enumerate(ops) if get_op(op.op).batch_level), len(ops))
    return ops[:first], ops[first:]
