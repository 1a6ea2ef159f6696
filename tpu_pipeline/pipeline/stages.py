"""Dataset → dataset stages. Each is a small frozen object: `stage.apply(dataset, input_context)`.

They compose in `Pipeline`, but each can be used alone on any `tf.data.Dataset`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence, Union

import tensorflow as tf

from tpu_pipeline.pipeline._common import tune
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops.registry import OpFn

Features = dict[str, Any]



def _seed_pairs(seed: Optional[int], rerandomize_each_iteration: Optional[bool] = None) -> tf.data.Dataset:
    """An endless dataset of `int64[2]` stateless seeds; its state is the iterator's (checkpointable)."""
    return tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=rerandomize_each_iteration).batch(2, drop_remainder=True)


def _parallel_map(dataset: tf.data.Dataset, fn: Callable, num_parallel_calls: Union[int, str],
                 deterministic: Optional[bool], name: str) -> tf.data.Dataset:
    """`dataset.map`, where one call at a time runs in the consumer's thread.

    A parallel map of one would hand every element to another thread and back, which costs more
    than a cheap function.
    """
    calls = tune(num_parallel_calls)
    if calls == 1:
        return dataset.map(fn, name=name)
    return dataset.map(fn, num_parallel_calls=calls, deterministic=deterministic, name=name)


@dataclasses.dataclass(frozen=True)
class MapFeatures:
    """One parallel map: optional parse, then ops in order. Fused so each element crosses threads once.

    `random_ops` lists which ops need a seed. When any does, each element is zipped with its own
    `int64[2]` seed from `tf.data.Dataset.random(seed + pipeline id)`, and op i gets
    `stateless_fold_in(element_seed, i)`: reproducible for a fixed seed, whatever the thread timing.
    """

    ops: Sequence[OpFn] = ()
    random_ops: Sequence[bool] = ()
    parse: Optional[Callable[[tf.Tensor], Features]] = None
    seed: Optional[int] = None
    num_parallel_calls: Union[int, str] = "autotune"
    deterministic: Optional[bool] = None
    name: str = "map_features"

    def __post_init__(self) -> None:
        if self.random_ops and len(self.random_ops) != len(self.ops):
            raise ValueError("random_ops must have one flag per op")

    @property
    def needs_seed(self) -> bool:
        return any(self.random_ops)

    def transform(self, element: Any, element_seed: Optional[tf.Tensor] = None) -> Features:
        features = self.parse(element) if self.parse is not None else dict(element)
        for index, op in enumerate(self.ops):
            seed = None
            if self.random_ops and self.random_ops[index]:
                seed = tf.random.experimental.stateless_fold_in(element_seed, index)
            features = op(features, seed)
        return features

    def apply(self, dataset: tf.data.Dataset, context: tf.distribute.InputContext) -> tf.data.Dataset:
        if not self.ops and self.parse is None:
            return dataset
        if self.needs_seed:
            seed = None if self.seed is None else self.seed + 1_000_003 * context.input_pipeline_id
            dataset = tf.data.Dataset.zip((dataset, _seed_pairs(seed)))
            fn = self.transform
        else:
            fn = lambda element: self.transform(element)  # noqa: E731
        return _parallel_map(dataset, fn, self.num_parallel_calls, self.deterministic, self.name)


@dataclasses.dataclass(frozen=True)
class Cache:
    """Caches in memory ('' path) or to files; a file cache gets one prefix per input pipeline."""

    path: str = ""

    def apply(self, dataset: tf.data.Dataset, context: tf.distribute.InputContext) -> tf.data.Dataset:
        if not self.path:
            return dataset.cache()
        tf.io.gfile.makedirs(self.path)
        suffix = f"pipeline{context.input_pipeline_id}-of-{context.num_input_pipelines}"
        return dataset.cache(tf.io.gfile.join(self.path, suffix))


@dataclasses.dataclass(frozen=True)
class Shuffle:
    buffer_size: int = 10_000
    seed: Optional[int] = None
    reshuffle_each_iteration: bool = True

    def apply(self, dataset: tf.data.Dataset, context: tf.distribute.InputContext) -> tf.data.Dataset:
        seed = None if self.seed is None else self.seed + context.input_pipeline_id
        return dataset.shuffle(self.buffer_size, seed=seed, reshuffle_each_iteration=self.reshuffle_each_iteration)


@dataclasses.dataclass(frozen=True)
class WindowShuffle:
    """Shuffles serialized records a window at a time: `window` records, one vectorized permutation.

    Why: `Dataset.shuffle` costs ~0.8 µs per element here, as much as reading the record, and it is
    per element however small. A window gathers records (single ones, or the blocks a source
    yields) into one vector, permutes it with one `gather`, and passes it on whole, so the cost is
    per window. Every record of a window leaves in a uniformly random position within it; unlike a
    streaming buffer, records do not cross window boundaries. Use it before a `Batch(records=True)`.

    Each window's permutation seed comes from `Dataset.random(seed + pipeline id)`, so a fixed seed
    gives the same order on every run, a new one each epoch when `reshuffle_each_iteration`, and
    the state lives in the iterator (checkpointable with it).
    """

    window: int = 10_000
    seed: Optional[int] = None
    reshuffle_each_iteration: bool = True
    num_parallel_calls: Union[int, str] = "auto"
    deterministic: Optional[bool] = None

    def apply(self, dataset: tf.data.Dataset, context: tf.distribute.InputContext) -> tf.data.Dataset:
        spec = dataset.element_spec
        if not isinstance(spec, tf.TensorSpec) or spec.dtype != tf.string or spec.shape.rank not in (0, 1):
            raise ConfigError(
                f"data.shuffle.mode=window shuffles serialized records (a string scalar or vector per element), "
                f"but this dataset yields {spec}; use data.shuffle.mode=stream"
            )
        windows = dataset.batch(self.window) if spec.shape.rank == 0 else dataset.rebatch(self.window)
        seed = None if self.seed is None else self.seed + context.input_pipeline_id
        windows = tf.data.Dataset.zip((windows, _seed_pairs(seed, self.reshuffle_each_iteration)))

        def permute(records: tf.Tensor, window_seed: tf.Tensor) -> tf.Tensor:
            order = tf.random.experimental.stateless_shuffle(tf.range(tf.shape(records)[0]), seed=window_seed)
            return tf.gather(records, order)

        return _parallel_map(windows, permute, self.num_parallel_calls, self.deterministic, "window_shuffle")


@dataclasses.dataclass(frozen=True)
class Repeat:
    """Repeats `count` times; None repeats forever."""

    count: Optional[int] = None

    def apply(self, dataset: tf.data.Dataset, context: tf.distribute.InputContext) -> tf.data.Dataset:
        if self.count == 1:
            return dataset
        return dataset.repeat(self.count)


def per_replica_batch_size(global_batch_size: int, context: tf.distribute.InputContext, key: str = "data.batch_size") -> int:
    """The batch one input pipeline produces: the global batch split over all replicas."""
    replicas = context.num_replicas_in_sync
    if global_batch_size % replicas:
        lower = global_batch_size - global_batch_size % replicas
        raise ConfigError(
            f"{key}={global_batch_size} is the GLOBAL batch and must be divisible by the "
            f"{replicas} replicas; use a multiple of {replicas}, e.g. {lower or replicas} or {lower + replicas}"
        )
    return global_batch_size // replicas


@dataclasses.dataclass(frozen=True)
class Batch:
    """Batches the per-replica share of the GLOBAL batch; drop_remainder keeps shapes static for TPUs.

    Sequential by default: on W1 (128 images of 224x224x3 bfloat16, 38 MB a batch) a parallel
    batch (num_parallel_calls) cost ~4% more CPU per image than a plain one (benchmarks/README.md),
    likely because tf.data fuses a parallel map with a following plain batch, and not with a
    parallel one.
    """

    global_batch_size: int
    drop_remainder: bool = True
    num_parallel_calls: Union[int, str, None] = None
    deterministic: Optional[bool] = None
    records: bool = False  # elements are serialized records, alone or in vectors (blocks, windows)

    def apply(self, dataset: tf.data.Dataset, context: tf.distribute.InputContext) -> tf.data.Dataset:
        size = per_replica_batch_size(self.global_batch_size, context)
        if self.records and dataset.element_spec.shape.rank == 1:
            # Vectors of records are cut into batches directly: no per-record element on the way.
            return dataset.rebatch(size, drop_remainder=self.drop_remainder)
        if self.num_parallel_calls is None:
            return dataset.batch(size, drop_remainder=self.drop_remainder)
        return dataset.batch(size, drop_remainder=self.drop_remainder, num_parallel_calls=tune(self.num_parallel_calls),
                             deterministic=self.deterministic)


@dataclasses.dataclass(frozen=True)
class ToOutputs:
    """Feature dict → (inputs, targets) as Keras fit expects; a list of keys keeps a dict."""

    inputs: Union[str, Sequence[str]] = "image"
    targets: Union[str, Sequence[str], None] = "label"
    num_parallel_calls: Union[int, str, None] = None  # picking keys: no work worth a thread crossing

    def _pick(self, features: Features, keys: Union[str, Sequence[str]], what: str) -> Any:
        names = [keys] if isinstance(keys, str) else list(keys)
        missing = [k for k in names if k not in features]
        if missing:
            raise ConfigError(
                f"data.outputs.{what}: feature(s) {missing} do not exist; features here: {sorted(features)}"
            )
        return features[keys] if isinstance(keys, str) else {k: features[k] for k in names}

    def apply(self, dataset: tf.data.Dataset, context: tf.distribute.InputContext) -> tf.data.Dataset:
        def fn(features: Features):
            inputs = self._pick(features, self.inputs, "inputs")
            if self.targets is None:
                return inputs
            return inputs, self._pick(features, self.targets, "targets")

        calls = None if self.num_parallel_calls is None else tune(self.num_parallel_calls)
        return dataset.map(fn, num_parallel_calls=calls, name="to_outputs")


@dataclasses.dataclass(frozen=True)
class Prefetch:
    buffer_size: Union[int, str] = "autotune"

    def apply(self, dataset: tf.data.Dataset, context: tf.distribute.InputContext) -> tf.data.Dataset:
        if self.buffer_size == 0:
            return dataset
        return dataset.prefetch(tune(self.buffer_size))


@dataclasses.dataclass(frozen=True)
class WithOptions:
    """Attaches tf.data.Options (see tpu_pipeline.pipeline.options)."""

    options: tf.data.Options

    def apply(self, dataset: tf.data.Dataset, context: tf.distribute.InputContext) -> tf.data.Dataset:
        return dataset.with_options(self.options)
