"""Assertions for input pipelines: every example exactly once across input pipelines and replicas,
and a dataset a TPU can take."""
from __future__ import annotations

import collections
from typing import Any, Iterable, Optional

import tensorflow as tf

from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.pipeline.checks.tpu_check import check_tpu_compatible


def _ids(element: Any, key: str) -> list[int]:
    if not isinstance(element, dict) or key not in element:
        raise AssertionError(f"assert_exactly_once reads the {key!r} feature of each batch, but the elements are "
                             f"{type(element).__name__}; keep the feature (e.g. outputs: null, or a list of keys)")
    return [int(i) for i in tf.reshape(element[key], [-1]).numpy()]


def assert_exactly_once(pipeline: Pipeline, num_examples: Optional[int] = None, *, num_input_pipelines: int = 1,
                        num_replicas: int = 1, key: str = "id", expected: Optional[Iterable[int]] = None) -> None:
    """One pass of `pipeline` (its `repeat` must end), built once per input pipeline as a strategy
    with `num_replicas` replicas would: together they deliver each expected id (0..num_examples-1,
    or `expected`) exactly once. The message lists repeated and missing ids."""
    wanted = collections.Counter(expected if expected is not None else range(num_examples or 0))
    seen: collections.Counter = collections.Counter()
    for index in range(num_input_pipelines):
        context = tf.distribute.InputContext(num_input_pipelines, index, num_replicas)
        for element in pipeline.build(context):
            seen.update(_ids(element, key))
    repeated = sorted(i for i, count in seen.items() if count > 1)
    missing = sorted(set(wanted) - set(seen))
    unexpected = sorted(set(seen) - set(wanted))
    if repeated or missing or unexpected:
        raise AssertionError(f"not exactly once over {num_input_pipelines} input pipeline(s), {num_replicas} replica(s): "
                             f"repeated {repeated[:20]}, missing {missing[:20]} ({len(missing)} in all; a dropped "
                             f"remainder batch?), unexpected {unexpected[:20]}")


def assert_tpu_ready(dataset: Any) -> None:
    """Static shapes and TPU dtypes, feature by feature (raises TpuCompatibilityError with the fix)."""
    check_tpu_compatible(dataset)
