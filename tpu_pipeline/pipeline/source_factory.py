"""The source a config names: one function, below both the builder and the error naming.

`Pipeline.from_config` reads from it, and so does `data_errors` (which scans the same files a
pipeline reads): kept in a module of its own so neither has to import the other for it.
"""
from __future__ import annotations

from tpu_pipeline.config.data import ArraySourceConfig, DataConfig, TFDSSourceConfig, TFRecordSourceConfig
from tpu_pipeline.pipeline.mixtures.mixture_source import MixturePart, MixtureSource
from tpu_pipeline.pipeline.sources.arrays import ArraySource
from tpu_pipeline.pipeline.sources.base import Source
from tpu_pipeline.pipeline.sources.dataset_dir import DatasetDirSource
from tpu_pipeline.pipeline.sources.tfds import TFDSSource
from tpu_pipeline.pipeline.sources.tfrecord import TFRecordSource


def source_from_config(config: DataConfig, prefix: str = "data") -> Source:
    """The source a config names, before the plan gives it its read options (`prefix`: the section its errors
    name, data or eval_data)."""
    if config.mixture is not None:
        return mixture_from_config(config, prefix)
    src = config.source
    if isinstance(src, TFRecordSourceConfig):
        return record_source(src, f"{prefix}.source")
    if isinstance(src, TFDSSourceConfig):
        return TFDSSource.from_config(src)  # decoded feature dicts: no parse follows
    assert isinstance(src, ArraySourceConfig)
    return ArraySource.from_npz(src.path, sharding=src.sharding)


def record_source(src: TFRecordSourceConfig, key: str = "data.source") -> Source:
    """The files of a tfrecord source section (`key`, as errors name it): a converted dataset's split, or a glob."""
    if src.dir is not None:
        return DatasetDirSource(dir=src.dir, split=src.split or "train", key=key)
    return TFRecordSource(files=src.files, compression=src.compression)


def mixture_from_config(config: DataConfig, prefix: str = "data") -> MixtureSource:
    """data.mixture's sources, weighted by examples (weight_by: tokens is converted by the plan, which
    measures each source's tokens per example)."""
    mixture = config.mixture
    assert mixture is not None
    parts = tuple(MixturePart(entry.name, record_source(entry.source, f"{prefix}.mixture.sources[{i}].source"),
                              entry.weight, entry.exhausted) for i, entry in enumerate(mixture.sources))
    shuffle = config.shuffle
    return MixtureSource(parts, tuple(entry.weight for entry in mixture.sources), seed=config.seed,
                         shuffle_buffer=shuffle.buffer_size if shuffle.enabled else 0,
                         reshuffle_each_iteration=shuffle.reshuffle_each_iteration)
