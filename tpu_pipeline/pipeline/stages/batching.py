"""Batches: the per-replica share of the global batch (`Batch`, `per_replica_batch_size`), and rows
that came in blocks cut into batches from those blocks (`rows_in_blocks`).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Optional, Union

import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.core.mixed_records import records_spec
from tpu_pipeline.pipeline.core.tuning import tune
from tpu_pipeline.pipeline.stages.base import Stage, StageContext


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
