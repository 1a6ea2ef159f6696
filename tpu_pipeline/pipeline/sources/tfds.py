"""TFDSSource: a prepared TensorFlow Datasets dataset as the first stage of a pipeline.

`tfds.builder(name, data_dir=...)` read with one `tfds.ReadConfig` per input pipeline: the
InputContext shards by file when the split has at least one file per pipeline (otherwise every
pipeline reads everything in the same seeded order and keeps every n-th element, as TFRecordSource
does); the file shuffle seed is the same on every host. TFDS decodes the features itself, so there is
no parse step: elements are feature dicts that the same downstream stages take.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

import tensorflow as tf

from tpu_pipeline.config.data import TFDSSourceConfig
from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.format import DatasetInfo
from tpu_pipeline.format.tfds import KEY, import_tfds, load_builder, not_prepared_error, tfds_info
from tpu_pipeline.pipeline.core import seeds
from tpu_pipeline.pipeline.core.tuning import tune
from tpu_pipeline.pipeline.sources.base import ReadOptions, Source
from tpu_pipeline.pipeline.sources.sharding import choose_sharding


def _num_files(builder: Any, split: str) -> Optional[int]:
    """Files the split reads, or None when TFDS cannot tell (e.g. under tfds.testing.mock_data)."""
    try:
        return len(builder.info.splits[split].file_instructions)
    except (KeyError, ValueError, AssertionError, TypeError, AttributeError):
        return None


def _feature_paths(features: Any, prefix: str = "") -> list[str]:
    tfds = import_tfds()
    paths = []
    for key, feat in features.items():
        paths.append(prefix + key)
        if isinstance(feat, tfds.features.FeaturesDict):
            paths += _feature_paths(feat, f"{prefix}{key}/")
    return paths


def _get(element: Mapping[str, Any], path: str) -> Any:
    for part in path.split("/"):
        element = element[part]
    return element


@dataclasses.dataclass(frozen=True)
class TFDSSource(Source):
    """Yields TFDS's decoded feature dicts (or the selected/renamed ones) for one input pipeline.

    Built once and iterated again each epoch: TFDS draws each iteration's file order itself, from
    the seed tree's file seed.
    """

    name: str
    split: str = "train"
    data_dir: Optional[str] = None
    as_supervised: bool = False
    features: Optional[Mapping[str, str]] = None
    skip_decoding: Sequence[str] = ()
    read: ReadOptions = ReadOptions(deterministic=True)  # element sharding needs TFDS's interleave in order

    @classmethod
    def from_config(cls, config: TFDSSourceConfig) -> "TFDSSource":
        """The source a config names; its read options come from the plan (`with_read`)."""
        return cls(
            name=config.name, split=config.split, data_dir=config.data_dir, as_supervised=config.as_supervised,
            features=config.features, skip_decoding=tuple(config.skip_decoding),
        )

    def with_read(self, read: ReadOptions) -> "TFDSSource":
        return dataclasses.replace(self, read=read)

    def info(self) -> DatasetInfo:
        return tfds_info(TFDSSourceConfig(
            name=self.name, split=self.split, data_dir=self.data_dir, as_supervised=self.as_supervised,
            features=dict(self.features) if self.features else None,
        ))

    def _check_paths(self, builder: Any) -> None:
        known = _feature_paths(builder.info.features)
        for what, paths in (("skip_decoding", list(self.skip_decoding)), ("features", list((self.features or {}).values()))):
            unknown = [p for p in paths if p not in known]
            if unknown:
                raise DataError(f"{KEY}.{what}: {unknown} are not features of {self.name}; its features: {known}")

    def _decoders(self) -> Optional[dict[str, Any]]:
        tfds = import_tfds()
        decoders: dict[str, Any] = {}
        for path in self.skip_decoding:
            node, parts = decoders, path.split("/")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = tfds.decode.SkipDecoding()
        return decoders or None

    def build(self, context: tf.distribute.InputContext, epoch: Optional[tf.Tensor] = None) -> tf.data.Dataset:
        tfds = import_tfds()
        read = self.read
        builder = load_builder(self.name, self.data_dir, key=f"{KEY}.data_dir")
        self._check_paths(builder)
        num_files = _num_files(builder, self.split)
        pipelines = context.num_input_pipelines
        mode = choose_sharding(read.sharding, pipelines if num_files is None else num_files, pipelines)
        read_config = tfds.ReadConfig(
            input_context=context if mode == "file" else None,
            # The same on every host (it depends on data.seed only): the file shards never overlap.
            shuffle_seed=seeds.node(read.seed, seeds.FILES)[0] & 0x7FFFFFFF,
            interleave_cycle_length=tune(read.cycle_length),
            interleave_block_length=read.block_length,
            try_autocache=False,  # caching is the cache stage's job, and only when asked for
            skip_prefetch=True,  # the pipeline prefetches once, at its end
        )
        supervised = builder.info.supervised_keys
        if self.as_supervised and not (isinstance(supervised, tuple) and len(supervised) == 2
                                       and all(isinstance(k, str) for k in supervised)):
            raise DataError(
                f"{KEY}.as_supervised: {self.name} has no (input, target) feature pair ({supervised!r}); choose "
                f"and name features with {KEY}.features instead"
            )
        try:
            dataset = builder.as_dataset(
                split=self.split, shuffle_files=read.shuffle_files, read_config=read_config,
                decoders=self._decoders(), as_supervised=self.as_supervised,
            )
        except AssertionError:
            raise not_prepared_error(self.name, self.data_dir, f"{KEY}.data_dir") from None
        except (ValueError, KeyError) as error:
            raise DataError(f"{KEY}: TFDS cannot read {self.name} split {self.split!r}: {error}") from None
        if mode == "element":
            if read.deterministic is False:
                raise ConfigError(
                    f"data.options.deterministic=false: {self.name} split {self.split!r} is sharded by element between "
                    f"{pipelines} input pipelines, which needs TFDS's file interleave in the same order on every "
                    "pipeline; unordered, pipelines would read overlapping examples. Set data.options.deterministic "
                    f"to true (or null), or use a split with at least {pipelines} files"
                )
            dataset = dataset.shard(pipelines, context.input_pipeline_id)
        if self.as_supervised:
            inputs, targets = supervised
            dataset = dataset.map(lambda x, y: {inputs: x, targets: y}, name="tfds_supervised")
        elif self.features:
            mapping = dict(self.features)
            dataset = dataset.map(lambda ex: {out: _get(ex, path) for out, path in mapping.items()}, name="tfds_features")
        return dataset
