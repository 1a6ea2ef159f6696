"""The source a config names: one function, below both the builder and the error naming.

`Pipeline.from_config` reads from it, and so does `data_errors` (which scans the same files a
pipeline reads): kept in a module of its own so neither has to import the other for it.
"""
from __future__ import annotations

from tpu_pipeline.config.data import ArraySourceConfig, DataConfig, TFDSSourceConfig, TFRecordSourceConfig
from tpu_pipeline.pipeline.dataset_dir import DatasetDirSource
from tpu_pipeline.pipeline.source_base import Source
from tpu_pipeline.pipeline.sources import ArraySource, TFRecordSource
from tpu_pipeline.pipeline.tfds_source import TFDSSource


def source_from_config(config: DataConfig) -> Source:
    """The source a config names, before the plan gives it its read options."""
    src = config.source
    if isinstance(src, TFRecordSourceConfig):
        if src.dir is not None:
            return DatasetDirSource(dir=src.dir, split=src.split or "train")
        return TFRecordSource(files=src.files, compression=src.compression)
    if isinstance(src, TFDSSourceConfig):
        return TFDSSource.from_config(src)  # decoded feature dicts: no parse follows
    assert isinstance(src, ArraySourceConfig)
    return ArraySource.from_npz(src.path, sharding=src.sharding)
