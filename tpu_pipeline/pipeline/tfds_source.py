"""TFDSSource: a prepared TensorFlow Datasets dataset as the first stage of a pipeline.

`tfds.builder(name, data_dir=...)` read with one `tfds.ReadConfig` per input pipeline: the
InputContext shards by file when the split has at least one file per pipeline (otherwise every
pipeline reads everything in the same seeded order and keeps every n-th element, as TFRecordSource
does); the file shuffle seed is the same on every host. TFDS decodes the features itself, so there is
no parse step: elements are feature dicts that the same downstream stages take.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence, Union

import tensorflow as tf

from tpu_pipeline.config.data import TFDSSourceConfig
from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.pipeline._common import tune
from tpu_pipeline.pipeline.sources import choose_sharding
from tpu_pipeline.records.tfds_reader import find_feature, import_tfds, label_key, load_builder, not_prepared_error

KEY = "data.source"


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
class TFDSSource:
    """Yields TFDS's decoded feature dicts (or the selected/renamed ones) for one input pipeline."""

    name: str
    split: str = "train"
    data_dir: Optional[str] = None
    as_supervised: bool = False
    features: Optional[Mapping[str, str]] = None
    skip_decoding: Sequence[str] = ()
    shuffle_files: bool = True
    file_seed: int = 0
    sharding: str = "auto"
    interleave_cycle_length: Union[int, str] = 16
    interleave_block_length: int = 1
    ordered: bool = True  # the pipeline's tf.data order (TFDS's own interleave follows it)

    @classmethod
    def from_config(cls, config: TFDSSourceConfig, ordered: bool = True) -> "TFDSSource":
        return cls(
            name=config.name, split=config.split, data_dir=config.data_dir, as_supervised=config.as_supervised,
            features=config.features, skip_decoding=tuple(config.skip_decoding), shuffle_files=config.shuffle_files,
            file_seed=config.file_seed, sharding=config.sharding, interleave_cycle_length=config.interleave_cycle_length,
            interleave_block_length=config.interleave_block_length, ordered=ordered,
        )

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

    def build(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
        tfds = import_tfds()
        builder = load_builder(self.name, self.data_dir, key=f"{KEY}.data_dir")
        self._check_paths(builder)
        num_files = _num_files(builder, self.split)
        pipelines = context.num_input_pipelines
        mode = choose_sharding(self.sharding, pipelines if num_files is None else num_files, pipelines)
        read_config = tfds.ReadConfig(
            input_context=context if mode == "file" else None,
            shuffle_seed=self.file_seed,  # the same on every host: the file shards never overlap
            interleave_cycle_length=tune(self.interleave_cycle_length),
            interleave_block_length=self.interleave_block_length,
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
                split=self.split, shuffle_files=self.shuffle_files, read_config=read_config,
                decoders=self._decoders(), as_supervised=self.as_supervised,
            )
        except AssertionError:
            raise not_prepared_error(self.name, self.data_dir, f"{KEY}.data_dir") from None
        except (ValueError, KeyError) as error:
            raise DataError(f"{KEY}: TFDS cannot read {self.name} split {self.split!r}: {error}") from None
        if mode == "element":
            if not self.ordered:
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


def tfds_info(config: TFDSSourceConfig) -> Any:
    """DatasetInfo of a TFDS source: split size, the label's class names, the features it yields."""
    from tpu_pipeline.pipeline.dataset_dir import DatasetInfo  # noqa: PLC0415 (avoids an import cycle)

    builder = load_builder(config.name, config.data_dir, key=f"{KEY}.data_dir")
    info = builder.info
    try:
        num_examples: Optional[int] = int(info.splits[config.split].num_examples) or None
    except (KeyError, ValueError, AssertionError, TypeError):
        num_examples = None
    supervised = info.supervised_keys
    if config.as_supervised and isinstance(supervised, tuple) and len(supervised) == 2:
        names = {str(supervised[0]): str(supervised[0]), str(supervised[1]): str(supervised[1])}
        label_path: Optional[str] = str(supervised[1])
    elif config.features:
        names = dict(config.features)
        label_path = config.features.get("label")
    else:
        names = {key: key for key in info.features.keys()}
        label_path = label_key(info)
    class_names = None
    if label_path:
        try:
            label = find_feature(info.features, label_path.split("/"))
            class_names = list(label.names) if hasattr(label, "names") else None
        except KeyError:
            class_names = None
    features = {}
    for out, path in names.items():
        try:
            features[out] = repr(find_feature(info.features, path.split("/")))
        except KeyError:
            features[out] = path
    return DatasetInfo(num_examples, class_names, features)
