"""Dataset → dataset stages. Each is a small frozen `Stage`: `stage.apply(dataset, context)`.

They compose in `Pipeline`, but each can be used alone on any `tf.data.Dataset` (with
`StageContext()`). Stages whose randomness changes per epoch (`uses_epoch`) read the epoch from the
context, a scalar tensor: every seed comes from the seed tree (tpu_pipeline.pipeline.core.seeds) rooted
at `seed`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Optional, Sequence, Union

import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops.registry import OpFn
from tpu_pipeline.pipeline.cache_key import check_cache_path, fingerprint, prepare_prefix
from tpu_pipeline.pipeline.core import seeds
from tpu_pipeline.pipeline.core.mixed_records import records_spec
from tpu_pipeline.pipeline.core.resume_position import split_position
from tpu_pipeline.pipeline.core.tuning import tune
from tpu_pipeline.pipeline.stage_base import Stage, StageContext
from tpu_pipeline.system import local_path

Features = dict[str, Any]


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
class MapFeatures(Stage):
    """One parallel map: optional parse, then ops in order. Fused so each element crosses threads once.

    `random_ops` lists which ops need a seed. When any does, the n-th element to enter this map on
    an input pipeline gets `seeds.element_seed(seed, "augment", pipeline, n)`, and op i gets
    `stateless_fold_in(element_seed, i)`: a pure function of a few integers. Seeds are given
    before the map, so its own thread timing and output order change nothing; a resumed pipeline
    passes `position`, the number of elements that entered before, so its seeds continue.
    """

    ops: Sequence[OpFn] = ()
    random_ops: Sequence[bool] = ()
    parse: Optional[Callable[[tf.Tensor], Features]] = None
    seed: int = 0
    num_parallel_calls: Union[int, str] = "autotune"
    deterministic: Optional[bool] = None
    name: str = "map_features"
    salted: bool = False  # on tf.data service workers: each worker folds its own salt into the element seeds

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

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        if not self.ops and self.parse is None:
            return dataset
        position = context.position
        if self.needs_seed and self.salted:
            pipeline = context.input_pipeline_id
            dataset = seeds.numbered_and_salted(dataset, position)
            fn = lambda element, position, salt: self.transform(  # noqa: E731
                element, seeds.element_seed(self.seed, seeds.AUGMENT, pipeline, position, salt))
        elif self.needs_seed:
            pipeline = context.input_pipeline_id
            dataset = tf.data.Dataset.zip((dataset, seeds.positions(position)))
            fn = lambda element, position: self.transform(  # noqa: E731
                element, seeds.element_seed(self.seed, seeds.AUGMENT, pipeline, position))
        else:
            fn = lambda element: self.transform(element)  # noqa: E731
        return _parallel_map(dataset, fn, self.num_parallel_calls, self.deterministic, self.name)


@dataclasses.dataclass(frozen=True)
class Cache(Stage):
    """Caches in memory ('' path) or to files; a file cache gets one prefix per input pipeline.

    `key`: a fingerprint of everything upstream (tpu_pipeline.pipeline.cache_key), part of each
    prefix, so a changed config never replays another config's cache. `Cache.for_config` sets it.
    """

    roles: ClassVar[tuple[str, ...]] = ("cache",)
    path: str = ""
    key: str = ""
    where: str = "data.cache.path"  # the config key, for messages

    @classmethod
    def for_config(cls, config: Any, plan: Any, prefix: str = "data") -> "Cache":
        """The cache `config.cache` asks for, its path checked now (one-line ConfigError), keyed on the config."""
        where = f"{prefix}.cache.path"
        if not config.cache.path:
            return cls(where=where)
        check_cache_path(config.cache.path, where)
        return cls(local_path(config.cache.path), fingerprint(config, plan), where)

    def file_prefix(self, context: tf.distribute.InputContext) -> str:
        """`<path>/pipeline<i>-of-<n>.<key>`: TensorFlow adds .index, .data-*, _<shard>.lockfile."""
        name = f"pipeline{context.input_pipeline_id}-of-{context.num_input_pipelines}"
        return tf.io.gfile.join(self.path, f"{name}.{self.key}" if self.key else name)

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        if not self.path:
            return dataset.cache()
        tf.io.gfile.makedirs(self.path)
        prefix = self.file_prefix(context.input)
        prepare_prefix(prefix, self.where)
        return dataset.cache(prefix)


@dataclasses.dataclass(frozen=True)
class Shuffle(Stage):
    """tf.data's shuffle buffer; its seed is the tree's (seed, "shuffle", pipeline), folded with the
    epoch when `reshuffle_each_iteration` (else every epoch gets the same order)."""

    buffer_size: int = 10_000
    seed: int = 0
    reshuffle_each_iteration: bool = True

    @property
    def uses_epoch(self) -> bool:
        return self.reshuffle_each_iteration

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        fold = context.epoch if self.reshuffle_each_iteration else None
        seed = seeds.scalar(seeds.key(self.seed, seeds.SHUFFLE, context.input_pipeline_id, fold))
        with seeds.without_global_seed():
            return dataset.shuffle(self.buffer_size, seed=seed, reshuffle_each_iteration=self.reshuffle_each_iteration)


@dataclasses.dataclass(frozen=True)
class WindowShuffle(Stage):
    """Shuffles serialized records a window at a time: `window` records, one vectorized permutation.

    Why: `Dataset.shuffle` costs ~0.8 µs per element here, as much as reading the record, and it is
    per element however small. A window gathers records (single ones, or the blocks a source
    yields) into one vector, permutes it with one `gather`, and passes it on whole, so the cost is
    per window. Every record of a window leaves in a uniformly random position within it; unlike a
    streaming buffer, records do not cross window boundaries. Use it before a `Batch(records=True)`.

    Window w's permutation seed is the tree's (seed, "window_shuffle", pipeline) with the epoch
    (when `reshuffle_each_iteration`) and w folded in: a fixed seed gives the same windows on every
    run, new ones each epoch.
    """

    window: int = 10_000
    seed: int = 0
    reshuffle_each_iteration: bool = True
    num_parallel_calls: Union[int, str] = "auto"
    deterministic: Optional[bool] = None

    @property
    def uses_epoch(self) -> bool:
        return self.reshuffle_each_iteration

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        spec = dataset.element_spec
        # int64: record indices (a mixture's sources over its record cache), shuffled as their records would be.
        if not isinstance(spec, tf.TensorSpec) or spec.dtype not in (tf.string, tf.int64) or spec.shape.rank not in (0, 1):
            raise ConfigError(
                f"data.shuffle.mode=window shuffles serialized records (a string scalar or vector per element), "
                f"but this dataset yields {spec}; use data.shuffle.mode=stream"
            )
        windows = dataset.batch(self.window) if spec.shape.rank == 0 else dataset.rebatch(self.window)
        fold = context.epoch if self.reshuffle_each_iteration else None
        root = seeds.key(self.seed, seeds.WINDOW_SHUFFLE, context.input_pipeline_id, fold)
        windows = tf.data.Dataset.zip((seeds.positions(), windows))

        def permute(index: tf.Tensor, records: tf.Tensor) -> tf.Tensor:
            window_seed = tf.random.experimental.stateless_fold_in(root, index)
            order = tf.random.experimental.stateless_shuffle(tf.range(tf.shape(records)[0]), seed=window_seed)
            return tf.gather(records, order)

        return _parallel_map(windows, permute, self.num_parallel_calls, self.deterministic, "window_shuffle")


@dataclasses.dataclass(frozen=True)
class Repeat(Stage):
    """Repeats `count` times; None repeats forever."""

    roles: ClassVar[tuple[str, ...]] = ("repeat",)
    count: Optional[int] = None

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        if self.count == 1:
            return dataset
        return dataset.repeat(self.count)

    def epochs(self, one_epoch: Callable[[tf.Tensor], tf.data.Dataset], differ: bool = True,
               first: int = 0, head: Optional[Callable[[tf.data.Dataset], tf.data.Dataset]] = None) -> tf.data.Dataset:
        """`one_epoch(e)` for e = 0, 1, ... in sequence: how a Pipeline repeats, so that everything
        before the repeat knows its epoch (file order, shuffle seeds). When the epochs do not
        `differ`, epoch 0 is simply repeated: a `flat_map` over epochs costs ~0.13 µs an element,
        and keeps tf.data from fusing a shuffle with the repeat (~0.2 µs more), which matters only
        for single small records (benchmarks/bench_epochs.py).

        A resumed stream starts at epoch `first`, whose dataset goes through `head` (the skip of
        what was delivered before)."""
        end = None if self.count is None else self.count
        if head is not None or first:
            if end is not None and first >= end:
                # Resumed after the last example (a checkpoint at the end of the data): nothing is left.
                return one_epoch(tf.constant(end - 1, tf.int64)).take(0)
            head = head or (lambda dataset: dataset)
            if differ and self.count != 1:
                # Built inside a function, as the uninterrupted stream builds this epoch: the
                # same seeds (an eager build would pair a shuffle's seed with TF's global seed).
                start = tf.data.Dataset.range(first, first + 1).flat_map(lambda epoch: head(one_epoch(epoch)))
            else:
                start = head(one_epoch(tf.constant(first, tf.int64)))
            if end == first + 1:
                return start
            if not differ:
                return start.concatenate(one_epoch(tf.constant(0, tf.int64)).repeat(None if end is None else end - first - 1))
            rest = tf.data.Dataset.range(first + 1, (1 << 62) if end is None else end)
            return start.concatenate(rest.flat_map(one_epoch))
        if self.count == 1:
            return one_epoch(tf.constant(0, tf.int64))
        if not differ:
            return one_epoch(tf.constant(0, tf.int64)).repeat(self.count)
        epochs = tf.data.Dataset.range(1 << 62 if self.count is None else self.count)
        return epochs.flat_map(one_epoch)


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


# Where a dataset of rows keeps the blocks its rows came from (`rows_in_blocks`).
_ROW_BLOCKS = "_tpu_pipeline_row_blocks"


def rows_in_blocks(blocks: tf.data.Dataset) -> tf.data.Dataset:
    """The rows of `blocks` (elements whose features are [n, ...] each: n rows), one row an element,
    with the blocks kept beside: a `Batch` applied right after it cuts its batches from the blocks
    (`Dataset.rebatch`: the same batches) instead of taking one row an element (`unbatch`, then `batch`): on 3,000 documents
    packed into rows of 256, that cost 0.023 of the pipeline's 0.100 ms of CPU per 1,000 tokens,
    the most of any part (benchmarks/README.md, issue 37).
    Anything else applied to the rows gets the rows."""
    rows = blocks.unbatch()
    setattr(rows, _ROW_BLOCKS, blocks)
    return rows


def row_blocks(dataset: tf.data.Dataset) -> Optional[tf.data.Dataset]:
    """The blocks `rows_in_blocks` made `dataset` from, or None."""
    return getattr(dataset, _ROW_BLOCKS, None)


@dataclasses.dataclass(frozen=True)
class Batch(Stage):
    """Batches the per-replica share of the GLOBAL batch; drop_remainder keeps shapes static for TPUs.

    Sequential by default: on W1 (128 images of 224x224x3 bfloat16, 38 MB a batch) a parallel
    batch (num_parallel_calls) cost ~4% more CPU per image than a plain one (benchmarks/README.md),
    likely because tf.data fuses a parallel map with a following plain batch, and not with a
    parallel one.
    """

    roles: ClassVar[tuple[str, ...]] = ("batch",)
    global_batch_size: int
    drop_remainder: bool = True
    num_parallel_calls: Union[int, str, None] = None
    deterministic: Optional[bool] = None
    records: bool = False  # elements are serialized records, alone or in vectors (blocks, windows)
    per_replica: bool = True  # False: batches of global_batch_size itself (data.sequence's windows of records)
    ragged: bool = False  # variable-length features with no data.sequence: kept ragged ([B, None]), not refused at run time

    def size(self, context: tf.distribute.InputContext) -> int:
        """Examples in one batch this stage makes for input pipeline `context`."""
        return per_replica_batch_size(self.global_batch_size, context) if self.per_replica else self.global_batch_size

    def after(self, context: StageContext) -> StageContext:
        """After a batch, an element is `size` examples: a resumed stream's position counts batches."""
        return dataclasses.replace(context, unit=self.size(context.input))

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        size = self.size(context.input)
        if self.records and records_spec(dataset.element_spec).shape.rank == 1:
            # Vectors of records are cut into batches directly: no per-record element on the way.
            return dataset.rebatch(size, drop_remainder=self.drop_remainder)
        blocks = row_blocks(dataset)
        if blocks is not None and not self.records and not self.ragged:
            return blocks.rebatch(size, drop_remainder=self.drop_remainder)  # rows that came in blocks
        if self.ragged:
            return dataset.ragged_batch(size, drop_remainder=self.drop_remainder)
        if self.num_parallel_calls is None:
            return dataset.batch(size, drop_remainder=self.drop_remainder)
        return dataset.batch(size, drop_remainder=self.drop_remainder, num_parallel_calls=tune(self.num_parallel_calls),
                             deterministic=self.deterministic)


@dataclasses.dataclass(frozen=True)
class ToOutputs(Stage):
    """Feature dict → (inputs, targets) as Keras fit expects; a list of keys keeps a dict.

    A windowed pipeline's elements carry their resume position (`resume_position.POSITION_KEYS`); it is dropped,
    or with `position=True` (the package's own iterators) returned beside: (outputs, position).
    """

    roles: ClassVar[tuple[str, ...]] = ("outputs",)
    inputs: Union[str, Sequence[str]] = "image"
    targets: Union[str, Sequence[str], None] = "label"
    num_parallel_calls: Union[int, str, None] = None  # picking keys: no work worth a thread crossing
    position: bool = False
    # Feature(s) giving Keras's sample weights: (inputs, targets, weights). An integer feature weighs 1
    # where non-zero (segment ids, masks), a float one its value; several (an example mask [B] and a
    # token mask [B, L]) multiply, broadcast from the left.
    weights: Union[str, Sequence[str], None] = None

    def _pick(self, features: Features, keys: Union[str, Sequence[str]], what: str) -> Any:
        names = [keys] if isinstance(keys, str) else list(keys)
        missing = [k for k in names if k not in features]
        if missing:
            raise ConfigError(
                f"data.outputs.{what}: feature(s) {missing} do not exist; features here: {sorted(features)}"
            )
        return features[keys] if isinstance(keys, str) else {k: features[k] for k in names}

    def _weights(self, features: Features) -> tf.Tensor:
        names = [self.weights] if isinstance(self.weights, str) else list(self.weights)
        product = None
        for name in names:
            value = self._pick(features, name, "weights")
            value = tf.cast(value, tf.float32) if value.dtype.is_floating else tf.cast(value != 0, tf.float32)
            if product is not None:  # [B] times [B, L]: the example's weight on each of its tokens
                while value.shape.rank < product.shape.rank:
                    value = value[..., tf.newaxis]
                while product.shape.rank < value.shape.rank:
                    product = product[..., tf.newaxis]
                value = product * value
            product = value
        return product

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        def fn(features: Features):
            features, position = split_position(features)
            inputs = self._pick(features, self.inputs, "inputs")
            outputs = inputs if self.targets is None else (inputs, self._pick(features, self.targets, "targets"))
            if self.weights is not None:
                outputs = (*outputs, self._weights(features))
            return (outputs, position) if self.position and position else outputs

        calls = None if self.num_parallel_calls is None else tune(self.num_parallel_calls)
        return dataset.map(fn, num_parallel_calls=calls, name="to_outputs")


@dataclasses.dataclass(frozen=True)
class SplitPosition(Stage):
    """For a windowed pipeline without outputs: the position dropped from each feature dict, or with
    `position=True` returned beside it, as ToOutputs does."""

    roles: ClassVar[tuple[str, ...]] = ("outputs",)
    position: bool = False

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        def fn(features: Features):
            features, position = split_position(features)
            return (features, position) if self.position else features

        return dataset.map(fn, name="split_position")


@dataclasses.dataclass(frozen=True)
class Prefetch(Stage):
    roles: ClassVar[tuple[str, ...]] = ("prefetch",)
    buffer_size: Union[int, str] = "autotune"

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        if self.buffer_size == 0:
            return dataset
        return dataset.prefetch(tune(self.buffer_size))


@dataclasses.dataclass(frozen=True)
class WithOptions(Stage):
    """Attaches tf.data.Options (see tpu_pipeline.pipeline.options)."""

    roles: ClassVar[tuple[str, ...]] = ("options",)
    options: tf.data.Options

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        return dataset.with_options(self.options)
